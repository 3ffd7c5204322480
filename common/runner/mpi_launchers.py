"""Which launcher starts the ranks, known from its own `--version` wherever it comes from (the venv,
MPIEXEC, PATH), and what the runner adds to its line so that a lesson runs and measures the same on
each: MPICH's hydra, Open MPI (ORTE in 4.x, PRRTE in 5.x), Slurm's srun, Intel MPI. A launcher it
does not know runs as given, with one note."""
import functools
import ipaddress
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

from common import mpilib
from common.runner.catalog import ROOT
from common.text import one_line


class LaunchError(RuntimeError):
    """No launcher can be found or started: one line for the learner."""


@dataclass(frozen=True)
class Launcher:
    kind: str      # 'hydra', 'open-mpi', 'srun', 'intel', or '' when unknown
    mpi: str       # the MPI it belongs to, in words: 'MPICH (hydra)', 'Open MPI 5.0.11 (PRRTE)', ...
    version: str   # its --version's first line, cleaned and cut to 100 columns


def python():
    """The ranks' Python: TUTOR_PYTHON (your own environment), else the venv's, else this one."""
    if os.environ.get("TUTOR_PYTHON"):
        return os.environ["TUTOR_PYTHON"]
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return os.path.relpath(venv, ROOT) if os.path.exists(venv) else sys.executable


def found():
    """The launcher as given or found, before the runner adds anything."""
    custom = os.environ.get("MPIEXEC")
    if custom:
        argv = shlex.split(custom)
        if not argv or not shutil.which(argv[0]):
            raise LaunchError(f"MPIEXEC={custom!r}: {argv[0] if argv else 'nothing'} is not a program "
                              "found on PATH")
        return argv
    beside = os.path.join(os.path.dirname(python()), "mpiexec")  # not resolved: a venv's python is a link
    if os.access(os.path.join(ROOT, beside), os.X_OK):
        return [beside]
    on_path = shutil.which("mpiexec")  # your own environment: the MPI your mpi4py was built for
    if not on_path:
        raise LaunchError("mpiexec not found beside the Python or on PATH: run `make setup` (or set MPIEXEC)")
    return [on_path]


def mpiexec(np):
    """The launcher's argv for `np` ranks: $MPIEXEC if set, else the mpiexec beside the ranks' Python (the
    venv's, or TUTOR_PYTHON's), else PATH's; with what its kind needs appended (mpi_launchers.additions)."""
    argv = found()
    return argv + additions(identify(argv[0]), argv, np)


def identify(program):
    """The Launcher `program` is (its --version, asked once per process)."""
    return _identify(os.path.join(ROOT, program) if os.sep in program else shutil.which(program) or program)


def flavour(program):
    """The launcher's kind: 'hydra', 'open-mpi', 'srun', 'intel', or '' when `--version` names none."""
    return identify(program).kind


@functools.lru_cache(maxsize=None)
def _identify(program):
    """The Launcher `program --version` says it is ('' kind when it cannot be run or says nothing known)."""
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return Launcher("", "unknown", one_line(f"{program} --version failed: {exc}"))
    return identify_text(out.stdout + out.stderr)


def identify_text(text):
    """A Launcher from what `--version` printed."""
    first = one_line(next((l for l in text.splitlines() if l.strip()), ""))
    ompi = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+)\.(\d+)\S*", text)
    if "Intel(R) MPI" in text:
        return Launcher("intel", "Intel MPI", first)
    if ompi:
        rte = "ORTE" if int(ompi[1]) < 5 else "PRRTE"
        return Launcher("open-mpi", f"Open MPI {ompi[0].split(') ')[1]} ({rte})", first)
    if "(PRRTE)" in text:
        return Launcher("open-mpi", "Open MPI (PRRTE)", first)
    if "HYDRA" in text:
        version = re.search(r"Version:\s+(\S+)", text)
        return Launcher("hydra", f"MPICH {version[1] if version else ''} (hydra)".replace("  ", " "), first)
    if re.match(r"slurm(-wlm)? \d", first):
        return Launcher("srun", f"Slurm {first.split()[-1]} (srun: the MPI its PMI plugin serves)", first)
    return Launcher("", "unknown", first)


def additions(launcher, argv, np, root=None, held=None, iface=None):
    """The words the runner appends to the launcher's own `argv` for a run of `np` ranks. Nothing the
    learner already gave is given twice or overridden. held: the Slurm allocation (allocation(); False:
    none); iface: hydra's interface there (hydra_iface())."""
    root = os.geteuid() == 0 if root is None else root
    held = allocation() if held is None else held or None
    given = " ".join(argv)
    add = []
    if launcher.kind == "open-mpi":
        if root and "--allow-run-as-root" not in given:
            add.append("--allow-run-as-root")     # Open MPI refuses root without it
        slots = held.slots if held else physical_cores()  # in an allocation, it reads its slots there
        if np > slots and "oversubscribe" not in given.lower():
            add.append("--oversubscribe")         # past its slots (a core each) it refuses to start
        if "--bind-to" not in given:
            add += ["--bind-to", "none"]          # it pins each rank to a core at -n <= 2
        if one_node(argv, held) and "btl" not in given and "OMPI_MCA_btl" not in os.environ:
            # on one node the ranks talk through shared memory; libfabric's and UCX's transports
            # (btl ofi, uct) only probe for network cards at MPI_Init: 1.7 of its 1.9 s on a laptop-like
            # machine without one (the PyPI wheel, measured), every run
            add += ["--mca", "btl", "^ofi,uct"]
    elif launcher.kind == "srun":
        if "--cpu-bind" not in given and "--cpu_bind" not in given:
            add.append("--cpu-bind=none")
    elif launcher.kind == "hydra" and held and "-iface" not in argv and not os.environ.get("HYDRA_IFACE"):
        # hydra starts its proxies on the nodes with srun; they call back to this host by its name,
        # which a node may not resolve (or resolve to an address it cannot reach): give its address
        iface = iface or hydra_iface(held)
        if iface:
            add += ["-iface", iface]
    elif launcher.kind == "intel":
        if "I_MPI_PIN" not in given and "I_MPI_PIN" not in os.environ:
            add += ["-genv", "I_MPI_PIN", "0"]    # Intel MPI pins ranks to cores by default
    return add  # hydra: no binding unless asked; root and -n past the cores are fine


HOST_WORDS = ("--host", "-H", "--hostfile", "-hostfile", "--machinefile", "-machinefile",
              "--default-hostfile")


def one_node(argv, held):
    """Whether Open MPI's `argv` runs on this machine alone: no Slurm allocation, no host or hostfile
    given on the line or in the environment (OMPI_MCA_/PRTE_MCA_ ... hostfile)."""
    named = any(w.split("=")[0] in HOST_WORDS for w in argv)
    in_env = any(k.startswith(("OMPI_MCA_", "PRTE_MCA_")) and k.endswith("hostfile") for k in os.environ)
    return not held and not named and not in_env


# what a launcher needs to let the other ranks live when one dies (a lesson with expects_death: 18)
SURVIVE = {"hydra": ["-disable-auto-cleanup"], "open-mpi": ["--with-ft", "ulfm"]}


def survivable(cmd):
    """The launch line `cmd` (launcher words, then -n) with what its launcher needs so that the
    death of one rank does not end the others; as given for a launcher the runner does not know, or
    an Open MPI before 5 (no --with-ft: its ranks then end with the dead one, as everywhere else)."""
    at = cmd.index("-n")
    launcher = identify(cmd[0])
    kind = launcher.kind if launcher.kind != "open-mpi" or re.search(r"Open MPI\D*([5-9]|\d\d)\.",
                                                                     launcher.mpi) else ""
    return cmd[:at] + [w for w in SURVIVE.get(kind, []) if w not in cmd[:at]] + cmd[at:]


@dataclass(frozen=True)
class Allocation:
    """A Slurm allocation the runner runs inside (salloc, sbatch), as its SLURM_* variables say."""
    job: str
    nodes: int        # SLURM_JOB_NUM_NODES
    tasks: int        # SLURM_NTASKS (-n), else the tasks per node summed; 0 when neither is given
    cpus: tuple       # CPUs on each node (SLURM_JOB_CPUS_PER_NODE expanded)
    nodelist: str     # SLURM_JOB_NODELIST, as Slurm writes it

    @property
    def cores(self):
        """The CPUs the allocation holds, on all its nodes."""
        return sum(self.cpus)

    @property
    def slots(self):
        """How many ranks it was asked for: its tasks, else a rank per CPU (Open MPI's slots there)."""
        return self.tasks or self.cores

    def words(self):
        cpus = "+".join(map(str, self.cpus)) if len(self.cpus) <= 4 else f"{self.cores} in all"
        return (f"Slurm job {self.job}: {self.nodes} node{'s' * (self.nodes != 1)} ({self.nodelist}), "
                + (f"{self.tasks} tasks, " if self.tasks else "") + f"{cpus} CPUs")


def per_node(text):
    """Slurm's count list, as in SLURM_JOB_CPUS_PER_NODE: '2(x3),1' -> [2, 2, 2, 1]; None when it is not one."""
    counts = []
    for part in (text or "").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def allocation(env=None):
    """The Slurm allocation this process runs inside (SLURM_JOB_ID set), or None. What a variable does
    not say reads as unknown: no tasks (0), one CPU per node."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    cpus = per_node(env.get("SLURM_JOB_CPUS_PER_NODE"))
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    nodes = int(nodes) if nodes.isdigit() and int(nodes) > 0 else len(cpus or []) or 1
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or ""
    tasks = int(tasks) if tasks.isdigit() else sum(per_node(env.get("SLURM_TASKS_PER_NODE")) or [])
    if not cpus or len(cpus) != nodes:
        cpus = [1] * nodes
    return Allocation(job, nodes, tasks, tuple(cpus), env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
                      or "?")


def cores():
    """(count, what): the CPUs a run's ranks share: the allocation's inside one, else this machine's."""
    held = allocation()
    if held:
        return held.cores, f"CPUs in Slurm job {held.job}"
    from common import timing
    return timing.usable_cores(), "usable cores"


def node_addresses(nodelist):
    """The allocation's nodes' addresses (scontrol's NodeAddr; a name is looked up), [] when unknown."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", nodelist], capture_output=True, text=True,
                             timeout=10, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for addr in re.findall(r"\bNodeAddr=(\S+)", out):
        try:
            found.append(str(ipaddress.ip_address(addr)))
        except ValueError:
            try:
                found.append(socket.gethostbyname(addr))
            except OSError:
                return []
    return found


def iface_to(addresses):
    """The one interface of this machine whose subnet holds every address given, or None."""
    from common.plumbing import network
    if not addresses:
        return None
    wanted = [ipaddress.ip_address(a) for a in addresses]
    names = {name for name, addr, prefix in network.interfaces() if prefix < 32 and not addr.startswith("127.")
             and all(a in ipaddress.ip_network(f"{addr}/{prefix}", strict=False) for a in wanted)}
    return names.pop() if len(names) == 1 else None


def hydra_iface(held):
    """This machine's interface on the allocation's nodes' network, or None (hydra then uses its name)."""
    return iface_to(node_addresses(held.nodelist))


def physical_cores():
    """Cores (not hardware threads) among the CPUs this process may use: Open MPI's slots on a
    machine without a hostfile or a resource manager. Usable CPUs when the topology is unreadable."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f, open(base + "core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def note():
    """The runner's one line about the launcher (unknown to it, or binding ranks), or None."""
    argv = found()
    return note_for(identify(argv[0]), argv)


def note_for(launcher, argv):
    """One line for a launcher the runner does not know or whose binding the learner chose."""
    name = os.path.basename(argv[0])
    if not launcher.kind:
        return f"note: `{name} --version` names no launcher the runner knows: it runs as given"
    given = " ".join(argv)
    if "--bind-to" in given and "--bind-to none" not in given or "--cpu-bind=" in given and \
            "--cpu-bind=none" not in given:
        return "note: your launcher binds ranks to cores: timings of threads and overlap measure that too"
    return None


def words(launcher, program):
    """The launcher in a few words, for a line about it: its MPI, or its name and --version."""
    return launcher.mpi if launcher.kind else f"{os.path.basename(program)} ({launcher.version[:40]})"


def world_env(np):
    """What the ranks need to prove their world (common/plumbing/world.py): the -n asked, the launcher's MPI."""
    return {"TUTOR_NP": str(np), "TUTOR_LAUNCHER": words(identify(found()[0]), found()[0])}


def mismatch():
    """mismatch_of this Python's mpi4py and the launcher (None when they agree or cannot be
    told, or mpi4py does not load here); mpi4py's MPI is read without initialising it."""
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        library = MPI.Get_library_version()
    except Exception:  # noqa: BLE001 - no verdict is better than a wrong one
        return None
    return mismatch_of(identify(found()[0]), library)


def mismatch_of(launcher, library_text):
    """A line when the launcher belongs to another MPI than the library mpi4py was built for; None when
    they agree or one of them cannot be told (srun and unknown launchers serve whatever PMI says)."""
    family = library_family(library_text)
    kind = {"hydra": "mpich", "open-mpi": "open-mpi"}.get(launcher.kind, "")
    if not family or not kind or family == kind:
        return None
    return (f"MISMATCH: mpi4py is built for {mpilib.parse(library_text).name}, the launcher is "
            f"{launcher.mpi}: build mpi4py for the launcher's MPI, or use that MPI's launcher")


# The PMI each MPI's ranks speak to srun (its --mpi plugin): the MPICH wheel's simple PMI and Intel
# MPI's speak PMI-2; Open MPI 5 speaks only PMIx (4.x too, unless built against Slurm's libpmi2).
PMI_SPOKEN = {"mpich": "pmi2", "intel": "pmi2", "open-mpi": "pmix"}


def srun_mpi(argv):
    """The --mpi plugin srun is given (argv, else SLURM_MPI_TYPE), or None: the cluster's MpiDefault."""
    for i, word in enumerate(argv):
        if word.startswith("--mpi="):
            return word.split("=", 1)[1]
        if word == "--mpi" and i + 1 < len(argv):
            return argv[i + 1]
    return os.environ.get("SLURM_MPI_TYPE") or None


@functools.lru_cache(maxsize=None)
def srun_plugins(program):
    """The MPI plugins `srun --mpi=list` names (pmix's versions too), or None when it says none."""
    try:
        out = subprocess.run([program, "--mpi=list"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout + out.stderr
    names = re.findall(r"^\s*(?:srun:\s*)?(\w+)\s*$", text.split("are...", 1)[-1], re.M)
    names += [v for line in re.findall(r"versions available:(.*)", text) for v in re.findall(r"\w+", line)]
    return tuple(dict.fromkeys(n for n in names if n not in ("MPI", "srun"))) or None


@functools.lru_cache(maxsize=None)
def mpi_default(program):
    """The cluster's MpiDefault (scontrol show config), or None when it cannot be read."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^MpiDefault\s*=\s*(\S+)", out, re.M)
    return m[1] if m else None


def pmi_refusal(argv, library_text, plugins, default):
    """One line when srun (argv) would start the ranks with a PMI their MPI (library_text) does not
    speak, or one this Slurm has no plugin for (plugins: `srun --mpi=list`'s); then each rank would be
    a world of one, or wait. None when they agree or cannot be told."""
    family = library_family(library_text)
    spoken = PMI_SPOKEN.get(family)
    asked = srun_mpi(argv) or default
    if not spoken or not asked:
        return None
    given = f"srun --mpi={asked}" if srun_mpi(argv) else f"srun (MpiDefault={asked})"
    offered = ", ".join(plugins or ()) or "none listed"
    if plugins and not any(p == asked for p in plugins):
        return f"{given}: this Slurm has no {asked} plugin (srun --mpi=list: {offered})"
    if asked.startswith(spoken):
        return None
    name = mpilib.parse(library_text).name
    has = [p for p in plugins or () if p.startswith(spoken)]
    return f"{given}: {name} speaks only {spoken}" + (
        f": use srun --mpi={spoken}" if has else ", not in this Slurm: unset MPIEXEC")


def pmi_check():
    """pmi_refusal for the launcher the runner will use, when it is srun (None otherwise)."""
    argv = found()
    if identify(argv[0]).kind != "srun":
        return None
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        library = MPI.Get_library_version()
    except Exception:  # noqa: BLE001 - no verdict is better than a wrong one
        return None
    given = srun_mpi(argv)
    refusal = pmi_refusal(argv, library, srun_plugins(argv[0]), None if given else mpi_default(argv[0]))
    if refusal or not given or given == "none" or not allocation():
        return refusal
    return plugin_loads(argv[0], given)


def plugin_loads(program, plugin):
    """None when srun's `plugin` starts a step here (a one-task `true`), else one line: a plugin that
    `srun --mpi=list` names may still fail to load. Slurm's pmix plugin dlopens the bare `libpmix.so`
    (mpi_pmix.c, _libpmix_open), which Debian 12 ships in libpmix-dev, not in libpmix2 (.so.2 only)."""
    try:
        out = subprocess.run([program, f"--mpi={plugin}", "-N", "1", "-n", "1", "true"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"srun --mpi={plugin}: a one-task probe did not finish ({exc})"
    said = [x.split("error:", 1)[-1].strip() for x in out.stderr.splitlines() if "error:" in x]
    if out.returncode == 0 or not any("MPI" in x or "mpi/" in x for x in said):
        return None
    reason = next((x for x in said if "load" in x), said[0]).rsplit(": ", 1)[-1]
    if "can not load PMIx library" in reason:
        return f"srun --mpi={plugin}: Slurm finds no libpmix.so (Debian: apt-get install libpmix-dev)"
    head = f"srun --mpi={plugin}: Slurm's {plugin} plugin does not load ("
    return head + one_line(reason, 84 - len(head) - 1) + ")"  # 100 columns after "tutor: blocked: "


def library_family(text):
    """'mpich', 'open-mpi', 'intel' or '' from MPI.Get_library_version()'s text."""
    return ("intel" if "Intel(R) MPI" in text else "mpich" if "MPICH" in text else
            "open-mpi" if "Open MPI" in text else "")
