"""The runner's guarantees (README, Troubleshooting): nothing lost, nothing left running, no traceback.

Each run here gets a TMPDIR of its own and a marker in its environment, so what it leaves behind
(processes, run folders) is counted exactly, even while other runs of the same fixtures go on."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from common.runner import mpi_launchers, supervise, verdict
from conftest import FIXTURES, TUTOR, end_marked, processes_running, tutor
from test_robust import one_line_error

# these tests look for the fixture lessons' processes by name: under pytest-xdist (make test) they
# share one worker, so one test never sees another's run of the same fixture as its own leftover
pytestmark = pytest.mark.xdist_group("fixture_processes")

FIX = {"TUTOR_LESSONS": FIXTURES}


def marked(mark):
    """PIDs of live processes whose environment carries TUTOR_TEST_MARK=mark (runner, mpiexec, ranks)."""
    return processes_running(mark=mark)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ranks_up(mark):
    """The run's ranks (python running the fixture, not the launcher whose line names it too)."""
    return [p for p in marked(mark) if "python" in os.path.basename(cmdline(p).split(" ", 1)[0])
            and "tests/fixtures/04_hang.py" in cmdline(p) and parent(p) != os.getpid()]


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def run_folders(tmpdir):
    return [n for n in os.listdir(tmpdir) if n.startswith("tutor-run-")]


@pytest.fixture
def hung_run(tmp_path):
    """A runner on the hanging fixture, with mpiexec and both ranks up; whatever it leaves is killed
    after the test (by pid, and only this run's), so a failing test does not leave ranks spinning."""
    mark, tmpdir = uuid.uuid4().hex, tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, **FIX, "TMPDIR": str(tmpdir), "TUTOR_TEST_MARK": mark}
    proc = subprocess.Popen([sys.executable, TUTOR, "run", "4", "-n", "2", "--timeout", "60"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ranks = [p for p in marked(mark) if "-m mpi4py tests/fixtures/04_hang.py" in cmdline(p)]
        if len(ranks) >= 3:  # mpiexec and two ranks
            break
        time.sleep(0.1)
    time.sleep(1.0)  # the ranks reach their Recv / Barrier
    yield proc, mark, tmpdir, env
    end_marked(proc, mark)


def wait_gone(mark, limit=10.0):
    deadline = time.monotonic() + limit
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return marked(mark)


# ---- processes left running ---------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_stop_signal_ends_every_process_of_the_run(hung_run, sig):
    proc, mark, tmpdir, _ = hung_run
    assert len(marked(mark)) >= 4, "runner, mpiexec and two ranks should be up"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    left = marked(mark)
    assert left == [], f"{len(left)} processes of the run outlived the runner: {[cmdline(p) for p in left]}"
    assert proc.returncode == 128 + sig, out
    assert f"interrupted by signal {int(sig)} ({signal.Signals(sig).name})" in out
    assert run_folders(tmpdir) == []


def test_closing_the_terminal_ends_every_process_of_the_run(tmp_path):
    """SIGHUP as a terminal sends it: the runner's terminal (a pty here) closes under a hanging run;
    its output then has nowhere to go, and the exit status still says what happened."""
    import pty
    import select
    mark, tmpdir = uuid.uuid4().hex, tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, **FIX, "TMPDIR": str(tmpdir), "TUTOR_TEST_MARK": mark}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the runner, in a session whose controlling terminal is the pty
        # as a terminal starts it: a suite run under nohup (SIGHUP ignored, inherited) made the runner
        # ignore the hang-up, as it rightly does for a nohup'd run, and time out instead
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.execve(sys.executable, [sys.executable, TUTOR, "run", "4", "-n", "2", "--timeout", "60"], env)
    try:
        deadline = time.monotonic() + 30
        while len(ranks_up(mark)) < 2 and time.monotonic() < deadline:  # (hydra adds a proxy, prterun none)
            if select.select([terminal], [], [], 0.1)[0]:
                os.read(terminal, 4096)
        time.sleep(1.0)
        assert len(ranks_up(mark)) == 2 and len(marked(mark)) >= 4  # runner, mpiexec, 2 ranks
        os.close(terminal)  # the terminal window closes: the kernel sends SIGHUP
        _, status = os.waitpid(pid, 0)
        left = marked(mark)
        assert left == [], f"{len(left)} processes outlived the terminal: {[cmdline(p) for p in left]}"
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP
        assert run_folders(tmpdir) == []
    finally:
        for left in marked(mark):
            os.kill(left, signal.SIGKILL)


def test_sigkill_of_the_runner_takes_the_run_along(hung_run):
    proc, mark, tmpdir, env = hung_run
    proc.kill()                                   # SIGKILL: no handler of the runner sees it
    proc.communicate(timeout=30)
    assert wait_gone(mark) == [], "mpiexec and the ranks outlived a runner killed by SIGKILL"
    assert run_folders(tmpdir)                    # it could not remove its own folder ...
    quick = subprocess.run([sys.executable, TUTOR, "run", "1", "-n", "1"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert run_folders(tmpdir) == []              # ... the next run does


def test_mpiexec_killed_is_named_and_its_ranks_ended(hung_run):
    proc, mark, tmpdir, _ = hung_run
    # the launcher is the runner's child (Open MPI's wheel execs its mpiexec into prterun: no name to go by)
    mpiexec = [p for p in marked(mark) if parent(p) == proc.pid]
    assert len(mpiexec) == 1, [cmdline(p) for p in marked(mark)]
    os.kill(mpiexec[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert marked(mark) == [], [(cmdline(p), open(f"/proc/{p}/stat").read()[:80]) for p in marked(mark)]
    assert proc.returncode == 137, out
    assert f"mpiexec itself (pid {mpiexec[0]}) was killed by signal 9 (SIGKILL)" in out
    assert "cannot be known" in out and "status -9" not in out
    assert run_folders(tmpdir) == []


@pytest.mark.parametrize("args", [["3"], ["6"], ["4", "--timeout", "1"], ["1", "--json", "."]],
                         ids=["crash", "unreadable-results", "timeout", "json-is-a-folder"])
def test_no_run_folder_is_left_behind(tmp_path, args):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = tutor("run", *args, env={**FIX, "TMPDIR": str(tmpdir)}, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr  # the runner's own
    assert run_folders(tmpdir) == []


def test_a_programmatic_caller_cannot_switch_the_watchdog_off():
    for timeout in (float("nan"), float("inf"), 0, -1, None):
        with pytest.raises(mpi_launchers.LaunchError, match="finite timeout"):
            supervise.supervise(["true"], timeout)


# ---- the results JSON: never over someone else's file ---------------------------------------------

@pytest.mark.parametrize("content", ["# my solved practice copy\nprint('hi')\n", '{"mine": 1}\n', " \n"],
                         ids=["learner-code", "other-json", "blank"])  # an empty file is taken: test_hostile
def test_json_never_replaces_a_file_it_did_not_write(tmp_path, content):
    target = tmp_path / "work.py"
    target.write_text(content)
    proc = tutor("run", "1", "-n", "2", "--json", str(target), env=FIX)
    one_line_error(proc, "exists and is not a results JSON the tutor wrote")
    assert proc.returncode == 2 and not proc.stdout.startswith("$ "), "it launched before refusing"
    assert target.read_text() == content


def test_json_never_deletes_the_lesson_itself(tmp_path):
    for name in ("01_pass.py", "01_pass.yaml"):
        (tmp_path / name).write_text(open(os.path.join(FIXTURES, name)).read())
    source = (tmp_path / "01_pass.py").read_text()
    proc = tutor("run", "1", "--json", str(tmp_path / "01_pass.py"), env={"TUTOR_LESSONS": str(tmp_path)})
    one_line_error(proc, "01_pass.py", "left alone")
    assert (tmp_path / "01_pass.py").read_text() == source


def test_json_replaces_its_own_earlier_results_and_keeps_the_verdict(tmp_path):
    out = tmp_path / "out.json"
    for count in ("3", "4"):
        proc = tutor("run", "1", "-n", "2", "--json", str(out), "--", "--count", count, env=FIX)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["params"] == {"count": 4} and doc["status"] == "pass" and doc["ok"] is True
    assert [c["ok"] for c in doc["checks"]] == [True, True]


def _unwritable(tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits; /proc takes no new files from anyone
        return "/proc/tutor-results.json", None
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    return str(folder / "out.json"), folder


@pytest.mark.parametrize("case", ["missing-folder", "a-folder", "unwritable"])
def test_json_path_is_checked_before_the_launch(tmp_path, case):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    target, fragment = {
        "missing-folder": (str(tmp_path / "missing" / "sub" / "out.json"), "no such folder"),
        "a-folder": (str(tmp_path), "a folder; name a file"),
        "unwritable": (_unwritable(tmp_path)[0], "cannot write there"),
    }[case]
    proc = tutor("run", "1", "-n", "2", "--json", target, env={**FIX, "TMPDIR": str(tmpdir)})
    one_line_error(proc, "--json", fragment)
    assert proc.returncode == 2 and "$ " not in proc.stdout, "it launched before refusing"
    assert not (tmp_path / "missing").exists(), "the runner made folders"
    assert run_folders(tmpdir) == []


def test_junit_never_replaces_a_file_it_did_not_write(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    one_line_error(tutor("check", "1", "--junit", str(target), env=FIX), "--junit", "left alone")
    assert target.read_text() == "my notes\n"


# ---- messages -----------------------------------------------------------------------------------

def test_lesson_help_is_shown_once_without_a_verdict():
    proc = tutor("run", "1", "-n", "2", "--", "--help", env=FIX)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("usage: 01_pass.py") == 1, proc.stdout
    assert "FAIL" not in proc.stdout + proc.stderr and "report.finish" not in proc.stderr


def test_a_rank_killed_is_named_before_the_mpi_error_it_caused():
    out = supervise.Outcome(rc=9, seconds=0.1, pids={0: 10, 1: 11, 2: 12}, statuses=[0, 9, 256],
                         errors={2: "MPI.Exception: Other MPI error, error stack: (x.py:3)"})
    lines = verdict.explain(None, out, None)
    assert lines[0].startswith("rank 1 (pid 11) was killed by signal 9 (SIGKILL)"), lines
    assert lines[1].startswith("rank 2 then failed (a peer was gone): MPI.Exception: Other MPI"), lines
    assert not any(l.startswith("rank 2 failed") or "rank 2 (pid 12) exited" in l for l in lines)


def test_a_python_error_is_still_the_culprit():
    out = supervise.Outcome(rc=1, seconds=0.1, pids={0: 10, 1: 11}, statuses=[9, 256],
                         errors={1: "ValueError: bad (x.py:3)"})
    assert verdict.explain(None, out, None)[0] == "rank 1 failed: ValueError: bad (x.py:3)"


def test_an_error_before_mpi_is_named_with_its_file_and_line():
    tail = ["Traceback (most recent call last):", '  File "<frozen runpy>", line 198, in _run_module_as_main',
            '  File "practice/01_sum.py", line 5, in <module>', "    x = y", "NameError: name 'y' is not defined"]
    lines = verdict.explain(None, supervise.Outcome(rc=1, seconds=0.1, tail=tail, statuses=[256, 256]), None)
    assert lines[0] == "the lesson exited with status 1: NameError: name 'y' is not defined (practice/01_sum.py:5)"


def test_watchdog_writes_mpi_errors_as_such(tmp_path, monkeypatch):
    from common.plumbing import run_folder, watchdog
    monkeypatch.setenv(run_folder.ENV, str(tmp_path))
    error = run_folder.rank_file(tmp_path, 3, "error")
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    watchdog.install(3)
    try:
        mpi_error = type("Exception", (Exception,), {"__module__": "mpi4py.MPI"})
        sys.excepthook(mpi_error, mpi_error("Other MPI error, error stack:\nmore"), None)
        assert open(error).read() == "MPI.Exception: Other MPI error, error stack:\n"
        sys.excepthook(ValueError, ValueError("plain"), None)
        assert open(error).read() == "ValueError: plain\n"
    finally:
        import faulthandler
        faulthandler.unregister(signal.SIGUSR1)
        watchdog._keep.pop().close()
