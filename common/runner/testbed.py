"""Two nodes on one machine, for tests and learners: two network namespaces, each with its own hostname
(a UTS namespace) and an address on a private bridge; the venv's hydra launches into them as over ssh.

    with testbed.bed(resolve=False) as b:     # root and `ip` needed; names unique per run
        env = {"MPIEXEC": b.mpiexec}          # -bootstrap-exec b.script -iface b.bridge -hosts A:2,B:2
    # torn down on leaving, at exit, on SIGTERM / SIGHUP; a bed whose owner died is swept by the next one
    testbed.bed(link_gbit=0.4)                # each node's link shaped (tc's tbf on the bridge's side)
    testbed.bed(slurm=True)                   # and a Slurm cluster on it: env = {"SLURM_CONF": b.slurm_conf}

Each node has a /tmp of its own, as a cluster node has (local_tmp=False: the nodes share this machine's):
every launch into a node runs in a mount namespace of its own with a fresh tmpfs on /tmp, into which
the paths under /tmp a cluster would share (the checkout, the state folder, `shared`) are bound; the
tmpfs goes with the last process that sees it, and the qdiscs with the veths: nothing to undo.

The bridge holds one /24 of 10.0.0.0/8 that no route or name server of this machine uses; nothing in
the namespaces can reach any other address. hydra is given the nodes' addresses, not their names, so
it never asks a name server; inside, a node's name resolves only with resolve=True
(/etc/netns/NODE/hosts). `-genv UCX_TLS tcp,self`: MPICH's UCX would otherwise pass messages between
the "nodes" through this machine's shared memory; MPICH's own shared memory still serves within a node.

slurm=True: a Slurm cluster of the two nodes (Debian's slurm-wlm and munge, as root): one munged on this
machine (its socket in the bed's folder, which every node sees), slurmctld in node a's network namespace
under a hostname of its own, one slurmd in each node's namespaces (its jobs get the node's own /tmp).
Their config is in the bed's folder (SLURM_CONF); `down` cancels the bed's jobs, then ends the daemons
by their ids and every process left in the nodes' namespaces.
"""
import atexit
import functools
import ipaddress
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass

from common.runner.catalog import ROOT

PREFIX = "tutb"   # every bed's bridge, veths, namespaces, /etc/netns and temp folders start with it
NETNS_ETC = "/etc/netns"
SSH = """#!/bin/sh
# tutor test bed {tag}: run a command on a node as `ssh [options] HOST COMMAND...` would
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
case "$1" in
{cases}
  *) echo "testbed {tag}: no node at $1" >&2; exit 255;;
esac
shift
exec ip netns exec "$node" unshare --uts --mount sh -c {program} "$node" "$*"
"""
# inside the node's namespaces ($0: the node, $1: the command); each launch on a node (hydra's proxy,
# PRRTE's daemon) gets a /tmp of its own, a tmpfs gone with the last process that sees it. The paths
# under /tmp that a cluster would share (the checkout, the state folder) are bound back into it.
NODE = """hostname "$0" || exit 255
{local}exec sh -c "$1"
"""
LOCAL_TMP = """mount -t tmpfs -o mode=1777 {tag}-tmp {stage} || exit 255
for p in {shared}; do
  mkdir -p "{stage}${{p#/tmp}}" && mount --bind "$p" "{stage}${{p#/tmp}}" || exit 255
done
mount --move {stage} /tmp || exit 255
"""


@dataclass
class Bed:
    tag: str
    bridge: str
    nodes: list       # [(name, address)]: name = network namespace = hostname
    script: str       # the ssh-like launcher hydra's -bootstrap-exec runs
    per_node: int
    shared: list = None     # the paths under /tmp every node sees; None: the nodes share all of /tmp
    link_gbit: float = None  # each node's link shaped to this rate (tbf), or None
    slurm_conf: str = None   # the bed's Slurm cluster (slurm=True): its slurm.conf, or None

    @property
    def mpiexec(self):
        hosts = ",".join(f"{addr}:{self.per_node}" for _, addr in self.nodes)
        venv = os.path.join(ROOT, ".venv", "bin", "mpiexec")
        # quoted: MPIEXEC is split as a shell would (a checkout at ~/my work must stay one word)
        return (f"{shlex.quote(venv)} -bootstrap-exec {shlex.quote(self.script)} -iface {self.bridge} -hosts {hosts} "
                "-genv UCX_TLS tcp,self")

    def mpirun(self, program):
        """Open MPI's line (PRRTE, Open MPI 5): its daemons reach their nodes through the same script."""
        hosts = ",".join(f"{addr}:{self.per_node}" for _, addr in self.nodes)
        subnet = ipaddress.ip_network(f"{self.nodes[0][1]}/24", strict=False)
        return (f"{program} --prtemca plm_ssh_agent {self.script} --host {hosts} --map-by "
                f"ppr:{self.per_node}:node --mca btl_tcp_if_include {subnet} --prtemca oob_tcp_if_include "
                f"{subnet}")


SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sinfo", "squeue", "scancel", "scontrol")
SLURM_INSTALL = "apt-get install slurm-wlm munge"


def missing(link_gbit=None, slurm=False):
    """Why no bed can be made here, or None; with link_gbit, a bed whose links are shaped; with slurm,
    one that runs a Slurm cluster."""
    if os.geteuid() != 0:
        return "the two-node test bed needs root (network namespaces)"
    for tool in ("ip", "unshare", "mount"):
        if not shutil.which(tool):
            return f"the two-node test bed needs `{tool}` (iproute2, util-linux)"
    if link_gbit is not None and not shutil.which("tc"):
        return "a shaped link needs `tc` (iproute2), which is not on PATH"
    lacking = [t for t in SLURM_TOOLS if not shutil.which(t)] if slurm else []
    if lacking:
        return f"a Slurm bed needs Slurm and munge (`{lacking[0]}` is not on PATH): {SLURM_INSTALL}"
    return None


def tmp_shared(extra=()):
    """The paths under /tmp that every node must see, outermost only: the checkout (with its venv),
    the state folder and run folders ($TUTOR_STATE, $TUTOR_RUN_ROOT), and `extra`."""
    state = os.environ.get("TUTOR_STATE") or os.path.join(ROOT, ".tutor")
    wanted = [ROOT, os.path.join(ROOT, ".venv"), state, os.environ.get("TUTOR_RUN_ROOT"), *extra]
    tmp = os.path.realpath("/tmp")
    found = []
    for path in sorted({os.path.realpath(p) for p in wanted if p}):
        if path.startswith(tmp + os.sep) and not any(path.startswith(f + os.sep) for f in found):
            found.append(path)
    return found


def shape(dev, gbit):
    """Token bucket on `dev`'s egress: at most gbit Gbit/s, a burst of 2 ms (64 KiB at least: a GSO
    packet), a queue of 50 ms."""
    rate = int(gbit * 1e9)
    burst = max(64 * 1024, rate // 8 // 500)
    out = subprocess.run(["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}bit", "burst",
                          str(burst), "latency", "50ms"], capture_output=True, text=True, timeout=30)
    if out.returncode:
        raise RuntimeError(f"tc could not shape {dev} to {gbit:g} Gbit/s (tbf): "
                           + (out.stderr.strip().splitlines() or ["no reason given"])[-1])


def ip(*args, check=True):
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def free_subnet(rng=random):
    """A 10.a.b.0/24 that overlaps no route, address or name server of this machine."""
    used = re.findall(r"(?:^|\s)(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", ip("-4", "route", "show", "table", "all")
                      + ip("-4", "-o", "addr"))
    if os.path.exists("/etc/resolv.conf"):
        with open("/etc/resolv.conf") as f:
            used += re.findall(r"^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)", f.read(), re.M)
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randint(16, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the test bed")


def _starttime(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def up(resolve=False, per_node=2, keep=False, local_tmp=True, link_gbit=None, shared=(), slurm=False):
    """Make a bed of two nodes. keep: it outlives this process (`bin/tutor testbed down` ends it).
    local_tmp: each node has a /tmp of its own, as on a cluster (only tmp_shared(shared) is seen by
    all); link_gbit: each node's link is shaped to that many Gbit/s (tc's tbf, bridge side); slurm: a
    Slurm cluster runs on it (start_slurm)."""
    why = missing(link_gbit, slurm)
    if why:
        raise RuntimeError(why)
    if link_gbit is not None and not 0 < link_gbit < 1000:
        raise RuntimeError(f"--link-gbit {link_gbit:g}: give a rate above 0 and below 1000 Gbit/s")
    sweep()
    tag = f"{PREFIX}{random.getrandbits(24):06x}"
    owner = "keep" if keep else f"{os.getpid()}:{_starttime(os.getpid())}"
    net = free_subnet()
    hosts = list(net.hosts())
    folder = os.path.join(tempfile.gettempdir(), tag)
    bed = Bed(tag, tag, [(f"{tag}-{n}", str(hosts[9 + i])) for i, n in enumerate("ab")],
              os.path.join(folder, "ssh"), per_node, tmp_shared(shared) if local_tmp else None, link_gbit)
    try:
        ip("link", "add", tag, "type", "bridge")
        ip("link", "set", tag, "alias", f"tutor testbed owner={owner}")
        ip("addr", "add", f"{hosts[0]}/24", "dev", tag)
        ip("link", "set", tag, "up")
        for (node, addr), side in zip(bed.nodes, "ab"):
            ip("netns", "add", node)
            ip("link", "add", tag + side, "type", "veth", "peer", "name", "veth0", "netns", node)
            ip("link", "set", tag + side, "master", tag, "up")
            if link_gbit is not None:  # the bridge's side: what enters the node (gone with the veth)
                shape(tag + side, link_gbit)
            ip("-n", node, "addr", "add", f"{addr}/24", "dev", "veth0")
            ip("-n", node, "link", "set", "veth0", "up")
            ip("-n", node, "link", "set", "lo", "up")
            os.makedirs(os.path.join(NETNS_ETC, node))
            with open(os.path.join(NETNS_ETC, node, "resolv.conf"), "w") as f:
                f.write("# tutor test bed: no name server, so no lookup leaves the bed\n")
            if resolve:
                with open(os.path.join(NETNS_ETC, node, "hosts"), "w") as f:
                    f.write("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in bed.nodes))
        os.makedirs(folder)
        local = ""
        if local_tmp:
            stage = os.path.join(folder, "stage")  # the node's tmpfs is filled here, then moved to /tmp
            os.mkdir(stage)
            for path in bed.shared:
                os.makedirs(path, exist_ok=True)
            # and this script, where /tmp holds it: a node launches into the other (PRRTE's tree)
            binds = [*bed.shared, *[p for p in tmp_shared(extra=[folder]) if p not in bed.shared]]
            local = LOCAL_TMP.format(tag=tag, stage=shlex.quote(stage), shared=" ".join(map(shlex.quote, binds)))
        cases = "\n".join(f"  {a}) node={n};;" for n, a in bed.nodes)
        with open(bed.script, "w") as f:
            f.write(SSH.format(tag=tag, cases=cases, program=shlex.quote(NODE.format(local=local))))
        os.chmod(bed.script, 0o755)
        if slurm:
            start_slurm(bed, folder)
    except BaseException:
        down(tag)
        raise
    return bed


def down(tag):
    """Remove bed `tag` and all it made; what is already gone is skipped."""
    tag = getattr(tag, "tag", tag)
    if not re.fullmatch(PREFIX + r"[0-9a-f]{6}", tag):
        raise ValueError(f"not a test bed: {tag!r}")
    stop_slurm(os.path.join(tempfile.gettempdir(), tag))
    for side in "ab":
        end_namespace(f"{tag}-{side}")
    for side in "ab":
        ip("link", "del", tag + side, check=False)  # the pair goes now, even while the namespace lingers
        ip("netns", "del", f"{tag}-{side}", check=False)  # (killed ranks' sockets may keep it a minute)
        shutil.rmtree(os.path.join(NETNS_ETC, f"{tag}-{side}"), ignore_errors=True)
    ip("link", "del", tag, check=False)
    shutil.rmtree(os.path.join(tempfile.gettempdir(), tag), ignore_errors=True)


def beds():
    """{tag: owner} of the beds on this machine (owner: 'keep', or 'pid:starttime')."""
    found = {}
    for name in os.listdir("/sys/class/net"):
        if re.fullmatch(PREFIX + r"[0-9a-f]{6}", name):
            try:
                with open(f"/sys/class/net/{name}/ifalias") as f:
                    alias = f.read().strip()
            except OSError:
                continue
            m = re.fullmatch(r"tutor testbed owner=(\S+)", alias)
            if m:
                found[name] = m.group(1)
    return found


def sweep():
    """Remove the beds whose owning process is gone (killed before it could tear its bed down)."""
    live = beds()
    stale = {t for t, owner in live.items() if owner != "keep"
             and _starttime(owner.split(":")[0]) != owner.split(":")[1]}
    netns = re.findall(r"^(" + PREFIX + r"[0-9a-f]{6})-[ab]\b", ip("netns", "list", check=False), re.M)
    veths = [m.group(1) for m in map(re.compile(PREFIX + r"([0-9a-f]{6})[ab]").fullmatch,
                                     os.listdir("/sys/class/net")) if m]
    stale |= {t for t in netns + [PREFIX + v for v in veths] if t not in live}  # parts whose bridge is gone
    for tag in sorted(stale):
        down(tag)
    return sorted(stale)


def end_namespace(netns):
    """Kill every process whose network namespace is `netns` (what a killed run or job left there)."""
    try:
        ns = os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == ns:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


# The bed's Slurm cluster: its files in FOLDER/slurm. Debian's slurm-wlm 22.05: no accounting, no
# cgroup confinement (proctrack/linuxproc, task/none); CPUs as the bed says, whatever slurmd finds.
SLURM_CONF = """# tutor test bed {tag}: a Slurm cluster of its two nodes (common/runner/testbed.py)
ClusterName={tag}
SlurmctldHost={ctl}({ctl_addr})
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
{nodes}
PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
SLURM_READY_S = 60


def slurm_env(conf):
    """This machine's environment for the bed's Slurm commands: its SLURM_CONF, no other job's SLURM_*."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "SLURM_CONF": conf}


def start_slurm(bed, folder):
    """munged, slurmctld (in node a's network namespace, hostname TAG-ctl) and a slurmd per node; each
    one's pid and start time go in FOLDER/slurm/daemons (stop_slurm ends them). Returns once sinfo
    shows both nodes idle; RuntimeError (a daemon's last log line) when they are not within a minute."""
    d = os.path.join(folder, "slurm")
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(d, sub))
    bed.slurm_conf = conf = os.path.join(d, "slurm.conf")
    nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={bed.per_node} State=UNKNOWN" for n, a in bed.nodes)
    ctl = f"{bed.tag}-ctl"
    with open(conf, "w") as f:
        f.write(SLURM_CONF.format(tag=bed.tag, ctl=ctl, ctl_addr=bed.nodes[0][1], d=d, nodes=nodes))
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")  # slurmd will not start without cgroup.conf
    with open(os.path.join(d, "cgroup.conf"), "w") as f:
        f.write(f"CgroupPlugin={'autodetect' if v2 else 'cgroup/v1'}\nCgroupAutomount=no\n")
    key = os.path.join(d, "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
        f.write(os.urandom(1024))
    env = slurm_env(conf)
    started = []

    def start(name, argv):
        with open(os.path.join(d, f"{name}.out"), "wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # out of the terminal's reach: ended by down
        started.append((name, proc))
        with open(os.path.join(d, "daemons"), "a") as f:
            f.write(f"{proc.pid} {_starttime(proc.pid)} {name}\n")

    start("munged", ["munged", "-F", "--force", f"--socket={d}/munge.socket", f"--key-file={key}",
                     f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
    _wait(lambda: os.path.exists(f"{d}/munge.socket"), started, d, "munged made no socket")
    start("slurmctld", ["ip", "netns", "exec", bed.nodes[0][0], "unshare", "--uts", "sh", "-c",
                        'hostname "$0" && exec slurmctld -D -f "$1"', ctl, conf])
    for node, addr in bed.nodes:  # in the node's namespaces, its own /tmp included, as a launch is
        start(f"slurmd-{node}", [bed.script, addr, f"exec slurmd -D -N {node} -f {shlex.quote(conf)}"])

    def idle():
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env,
                             timeout=20)
        return sorted(out.stdout.split()) == sorted([s for n, _ in bed.nodes for s in (n, "idle")])
    _wait(idle, started, d, "its nodes are not idle")


def _wait(ready, started, d, what):
    deadline = time.monotonic() + SLURM_READY_S
    while not ready():
        dead = [(name, p.returncode) for name, p in started if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            name = dead[0][0] if dead else started[-1][0]
            said = _last_line(os.path.join(d, f"{name}.out")) or _last_line(os.path.join(d, f"{name}.log"))
            raise RuntimeError(f"the bed's Slurm did not start: {name} " +
                               (f"exited {dead[0][1]}" if dead else f"ran {SLURM_READY_S} s and {what}") +
                               (f" ({said})" if said else ""))
        time.sleep(0.25)


def _last_line(path):
    try:
        with open(path, errors="replace") as f:
            return next((x.strip() for x in reversed(f.read().splitlines()) if x.strip()), "")[:200]
    except OSError:
        return ""


def stop_slurm(folder):
    """The bed's Slurm, ended: its jobs cancelled (while slurmctld still runs), then its daemons, by the
    ids start_slurm wrote (a pid whose start time differs is another process now, and is left alone)."""
    d = os.path.join(folder, "slurm")
    try:
        with open(os.path.join(d, "daemons")) as f:
            daemons = [(int(p), t, name) for p, t, name in (x.split() for x in f if x.strip())]
    except (OSError, ValueError):
        return
    alive = [(pid, name) for pid, t, name in daemons if _starttime(pid) == t]
    env = slurm_env(os.path.join(d, "slurm.conf"))
    if any(name == "slurmctld" for _, name in alive):
        try:
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env,
                                  timeout=10).stdout.split()
            if jobs:
                subprocess.run(["scancel", *jobs], capture_output=True, env=env, timeout=10)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and subprocess.run(
                        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env,
                        timeout=10).stdout.split():
                    time.sleep(0.25)
        except (OSError, subprocess.SubprocessError):
            pass  # the daemons go below anyway, and what their jobs left goes with the namespaces
    for pid, _ in reversed(alive):  # the slurmds first, munged last
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_running(pid) for pid, _ in alive):
        time.sleep(0.1)
    for pid, _ in alive:
        if _running(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _running(pid):
    """pid is a process that has not exited (a zombie has; so has one that is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def bed(resolve=False, per_node=2, local_tmp=True, link_gbit=None, shared=(), slurm=False):
    """A bed for the `with` block, torn down however the block ends (SIGTERM and SIGHUP included)."""
    b = up(resolve, per_node, local_tmp=local_tmp, link_gbit=link_gbit, shared=shared, slurm=slurm)
    closer = functools.partial(down, b.tag)
    atexit.register(closer)
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def leave(signum, frame):
        raise SystemExit(128 + signum)
    for s in old:
        signal.signal(s, leave)
    try:
        yield b
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        closer()
        atexit.unregister(closer)


def describe(b):
    """The bed, its nodes, what they share of /tmp and their links, wrapped to 100 columns."""
    from common import text
    tmp = ("the nodes share this machine's /tmp" if b.shared is None else
           "each node has a /tmp of its own" + (f"; every node sees {', '.join(b.shared)}" if b.shared else ""))
    link = f"; each node's link shaped to {b.link_gbit:g} Gbit/s (tbf)" if b.link_gbit is not None else ""
    slurm = (f"; a Slurm cluster of both nodes ({b.per_node} CPUs each; slurmctld at {b.nodes[0][1]})"
             if b.slurm_conf else "")
    return text.wrapped(f"testbed {b.tag}: " + ", ".join(f"{n} {a}" for n, a in b.nodes) + f"; {tmp}{link}{slurm}")


def run_on_bed(argv, resolve=False, per_node=2, local_tmp=True, link_gbit=None, slurm=False):
    """Run argv (e.g. bin/tutor run 05 -n 4) with MPIEXEC set to a fresh bed's line, or with slurm, with
    SLURM_CONF set to its cluster's (argv then asks for an allocation: salloc -N 2 -n 4 ...); its status."""
    with bed(resolve, per_node, local_tmp, link_gbit, slurm=slurm) as b:
        print(describe(b), flush=True)
        env = {"SLURM_CONF": b.slurm_conf} if slurm else {"MPIEXEC": b.mpiexec}
        print(" ".join(f"{k}={v}" for k, v in env.items()), flush=True)
        return subprocess.run(argv, env={**(slurm_env(b.slurm_conf) if slurm else os.environ), **env}).returncode
