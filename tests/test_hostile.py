"""A hostile learner, round two (issue 27): every file the kit writes is guarded, a full or read-only
disk is one line, nothing escapes Ctrl-Z or SIGSTOP, stray input is refused before a launch.

Full and read-only disks are made for real, in a mount namespace of the test's own (`unshare -m`, a
small tmpfs that dies with it): skipped with a reason where that cannot be made (no root, no unshare)."""
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from common import flight, plot, report
from common.plumbing import guard, run_folder
from conftest import FIXTURES, ROOT, TUTOR, end_marked, processes_running, tutor
from test_practice import PRACTICE_FIXTURES
from test_robust import one_line_error

# no xdist_group: processes_running() and the marks count only this worker's own processes
FIX = {"TUTOR_LESSONS": FIXTURES}
LESSON_05 = os.path.join(ROOT, "lessons", "05_ring_allreduce.py")


def _can_unshare():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


namespaced = pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare -m` (a tmpfs of its own)")


def in_namespace(script, env=None, timeout=180):
    """Run a shell script in a mount namespace of its own (its mounts vanish with it); $TUTOR is
    bin/tutor under this Python. Returns the CompletedProcess."""
    env = {**os.environ, **(env or {}), "TUTOR": f"{sys.executable} {TUTOR}"}
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def shown(path):
    """`path` as the kit shows it from ROOT, where in_namespace runs it (common/text.path_shown):
    relative where that is shorter, as for a checkout beside pytest's folders in /tmp."""
    rel = os.path.relpath(path, ROOT)
    return rel if len(rel) <= len(str(path)) else str(path)


FILL = "dd if=/dev/zero of={d}/fill bs=1k 2>/dev/null; true"  # fill a tmpfs to its last block


# ---- data loss: the lessons' output flags go through the guard ------------------------------------

@pytest.mark.parametrize("flag", ["--csv", "--plot", "--trace-png"])
def test_a_lesson_output_flag_never_replaces_a_practice_copy(tmp_path, flag):
    copy = tmp_path / "05_ring_allreduce.py"
    shutil.copy(LESSON_05, copy)
    before = copy.read_bytes()
    proc = tutor("run", "05", "-n", "2", "--", flag, str(copy))
    one_line_error(proc, flag, "is not a", "the tutor wrote; left alone")  # a long path: no width asked
    assert proc.returncode == 2 and "$ " not in proc.stdout, "it launched before refusing"
    assert copy.read_bytes() == before


def test_the_lessons_writers_refuse_too(tmp_path, monkeypatch):
    """The second line of defence: a lesson run by hand (no runner to vet its flags)."""
    monkeypatch.setenv("TUTOR_STATE", str(tmp_path / "state"))
    mine = tmp_path / "mine.py"
    mine.write_text("print('my work')\n")
    with pytest.raises(guard.Refused, match="left alone"):
        report.write_csv(str(mine), [{"size": 8, "us": 1.0}])
    with pytest.raises(guard.Refused, match="left alone"):
        report.write_json(str(mine), {"lesson": "x", "np": 1, "ranks": []})
    assert "left alone" in plot.cannot_write(str(mine))
    assert mine.read_text() == "print('my work')\n"
    ours = tmp_path / "r.csv"  # its own earlier output is replaced; once changed by hand, it is not
    report.write_csv(str(ours), [{"size": 8}])
    report.write_csv(str(ours), [{"size": 16}])
    assert "16" in ours.read_text()
    ours.write_text(ours.read_text() + "my note\n")
    with pytest.raises(guard.Refused):
        report.write_csv(str(ours), [{"size": 32}])


def test_output_paths_land_where_the_learner_typed_them_and_are_replaced_next_time(tmp_path):
    here = tmp_path / "sub"
    here.mkdir()
    env = {**os.environ, "TUTOR_STATE": str(tmp_path / "state")}
    for _ in range(2):  # the second run replaces the first run's CSV: the ledger knows it
        proc = subprocess.run([sys.executable, TUTOR, "run", "05", "-n", "2", "--", "--csv", "r.csv",
                               "-b", "8", "-e", "64"], cwd=here, env=env, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (here / "r.csv").read_text().startswith("size,") and not os.path.exists(os.path.join(ROOT, "r.csv"))


def test_output_paths_are_made_absolute_and_other_flags_left_alone(tmp_path):
    from common.runner import output_files
    given = ["--trace", "--csv", "r.csv", "--plot=p.png", "--counts", "8"]  # 05's --trace: no path
    assert output_files.lesson_outputs(given, here=str(tmp_path)) == [
        "--trace", "--csv", str(tmp_path / "r.csv"), f"--plot={tmp_path / 'p.png'}", "--counts", "8"]


def test_json_onto_an_empty_file_is_accepted(tmp_path):
    target = tmp_path / "tmp.XXXX"  # what mktemp makes
    target.write_text("")
    proc = tutor("run", "1", "-n", "2", "--json", str(target), env=FIX)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(target.read_text())["status"] == "pass"


@pytest.mark.parametrize("args", [["run", "1", "--json", ""], ["check", "1", "--junit", ""]])
def test_an_empty_file_name_is_refused(args):
    proc = tutor(*args, env=FIX)
    one_line_error(proc, "needs a file name", code=2)
    assert "$ " not in proc.stdout and "passed" not in proc.stdout


@namespaced
@pytest.mark.parametrize("command, verdict", [("run 1 -n 2 --json {d}/out.json", "PASS  01_pass"),
                                              ("check 1 --junit {d}/junit.xml", "2 passed, 0 failed")])
def test_a_results_file_that_fails_on_a_full_disk_still_gives_the_verdict(tmp_path, command, verdict):
    d = tmp_path / "full"
    d.mkdir()
    proc = in_namespace(f"mount -t tmpfs -o size=32k none {d} && {FILL.format(d=d)}; "
                        f"$TUTOR {command.format(d=d)}", env=FIX)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert verdict in proc.stdout and "Traceback" not in proc.stderr
    assert "warning" in proc.stderr and "No space left" in proc.stderr and "usage" not in proc.stderr


@namespaced
def test_practice_force_on_a_full_disk_keeps_the_learners_copy(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    proc = in_namespace(
        f"mount -t tmpfs -o size=64k none {d} && $TUTOR practice 01 >/dev/null && echo '# mine' >> {d}/01_sum.py "
        f"&& {FILL.format(d=d)}; $TUTOR practice 01 --force; echo rc=$?; ls {d}; tail -1 {d}/01_sum.py",
        env={"TUTOR_LESSONS": PRACTICE_FIXTURES, "TUTOR_PRACTICE": str(d), "TUTOR_STATE": str(tmp_path / "s")})
    assert "Traceback" not in proc.stderr and "rc=2" in proc.stdout, proc.stdout + proc.stderr
    assert "nothing was changed" in proc.stderr and "No space left" in proc.stderr
    assert proc.stdout.rstrip().endswith("# mine"), proc.stdout  # the copy is still there, unchanged
    assert "01_sum.py.bak" not in proc.stdout


def test_check_mine_without_a_copy_names_the_kept_one(tmp_path):
    env = {**os.environ, "TUTOR_LESSONS": PRACTICE_FIXTURES, "TUTOR_PRACTICE": str(tmp_path / "p"),
           "TUTOR_STATE": str(tmp_path / "s"), "PYTHONPATH": ROOT}
    assert tutor("practice", "01", env=env).returncode == 0
    os.rename(tmp_path / "p" / "01_sum.py", tmp_path / "p" / "01_sum.py.bak")
    proc = tutor("check", "01", "--mine", env=env)
    one_line_error(proc, "01_sum.py.bak", "mv ")


# ---- dead ends ------------------------------------------------------------------------------------

@namespaced
@pytest.mark.parametrize("folder, command", [("TUTOR_STATE", "hint 01"), ("TUTOR_STATE", "practice 01"),
                                             ("TUTOR_PRACTICE", "practice 01"),
                                             ("TUTOR_STATE", "check 01 --mine")])
def test_a_read_only_folder_is_one_line_before_any_run(tmp_path, folder, command):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    other = "TUTOR_PRACTICE" if folder == "TUTOR_STATE" else "TUTOR_STATE"
    setup = f"TUTOR_PRACTICE={rw} $TUTOR practice 01 >/dev/null && " if "--mine" in command else ""
    proc = in_namespace(f"{setup}mount -t tmpfs -o ro none {ro} && $TUTOR {command}",
                        env={"TUTOR_LESSONS": PRACTICE_FIXTURES, folder: str(ro), other: str(rw),
                             "PYTHONPATH": ROOT})
    one_line_error(proc, shown(ro), "not writable", folder)
    assert proc.returncode == 2 and "checking" not in proc.stdout


def test_a_copy_without_its_markers_says_how_to_get_them_back(tmp_path):
    env = {**os.environ, "TUTOR_LESSONS": PRACTICE_FIXTURES, "TUTOR_PRACTICE": str(tmp_path / "p"),
           "TUTOR_STATE": str(tmp_path / "s"), "PYTHONPATH": ROOT}
    assert tutor("practice", "01", env=env).returncode == 0
    path = tmp_path / "p" / "01_sum.py"
    text = path.read_text().replace('raise NotImplementedError("exercise allreduce: not done yet")',
                                    "value = ctx.comm.allreduce(ctx.rank + 1, op=MPI.SUM)")
    path.write_text("".join(l for l in text.splitlines(True) if "exercise: allreduce" not in l))
    proc = tutor("check", "01", "--mine", env=env)
    said = " ".join(proc.stderr.split())
    assert proc.returncode != 0 and "no exercise markers left" in said, proc.stdout + proc.stderr
    assert "practice 01 --force" in said and "your ," not in proc.stdout + proc.stderr


def test_the_summary_line_carries_the_cause(tmp_path):
    """A launcher that fails before the lesson runs (another MPI's mpirun, say): its banner of dashes
    and exit codes comes last; the cause, many lines above it, is what the summary says."""
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'Error: mpi4py was built for another MPI'\n"
                    + "echo 'some detail'\n" * 12 + "echo '-----------------------------'\n"
                    "echo '   Exit code:    16'\necho '-----------------------------'\nexit 16\n")
    fake.chmod(0o755)
    proc = tutor("run", "1", "-n", "2", env={**FIX, "MPIEXEC": str(fake)})
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 3 and last.startswith("CRASH  01_pass"), proc.stdout + proc.stderr
    assert "status 16: Error: mpi4py was built for another MPI" in last and len(last) <= 100, last
    assert not re.search(r"status 16: -+$", proc.stderr, re.M), proc.stderr


def test_a_crash_is_named_on_the_summary_line():
    proc = tutor("run", "3", "-n", "2", env=FIX)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("CRASH  03_crash") and "rank 1" in last, last


# ---- runs that escape -----------------------------------------------------------------------------

def _states(mark):
    out = {}
    for pid in processes_running(mark=mark):
        try:
            with open(f"/proc/{pid}/stat") as f:
                out[pid] = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            pass
    return out


def _hung(mark, *args, tmpdir=None):
    env = {**os.environ, **FIX, "TUTOR_TEST_MARK": mark, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    proc = subprocess.Popen([sys.executable, TUTOR, "run", "4", "-n", "2", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while len(processes_running(mark=mark)) < 4 and time.monotonic() < deadline:  # runner, mpiexec, 2 ranks
        time.sleep(0.1)
    time.sleep(1.0)
    return proc


def test_ctrl_z_stops_the_run_with_the_runner_and_fg_continues_it():
    mark = uuid.uuid4().hex
    proc = _hung(mark, "--timeout", "60")
    try:
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 10
        while set(_states(mark).values()) != {"T"} and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped = _states(mark)
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.0)
        going = _states(mark)
    finally:
        end_marked(proc, mark)
    assert len(stopped) >= 4 and set(stopped.values()) == {"T"}, stopped
    assert "T" not in going.values(), going


def test_a_rank_stopped_with_sigstop_is_named_in_the_timeout_report(tmp_path):
    mark = uuid.uuid4().hex
    # --device cpu: on a GPU node, auto's probe of the GPUs (a collective of its own, seconds long) was
    # still under way when rank 1 stopped, and rank 0 was rightly named in choose_gpu()
    proc = _hung(mark, "--timeout", "15", "--device", "cpu", tmpdir=tmp_path)
    try:
        pid_file, deadline = None, time.monotonic() + 12
        while not pid_file and time.monotonic() < deadline:  # rank 1 has joined MPI: it wrote its pid
            pid_file = next(iter(tmp_path.glob(run_folder.rank_file("tutor-run-*", 1, "pid"))), None)
            time.sleep(0.1)
        assert pid_file, "rank 1 never joined MPI"
        time.sleep(0.5)
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)
        out = proc.communicate(timeout=60)[0]
    finally:
        end_marked(proc, mark)
    assert proc.returncode == 124, out
    assert re.search(r"rank 1: stopped, state T \(pid \d+\)", out), out
    assert re.search(r"rank 0: wait_forever\(\) at tests/fixtures/04_hang.py", out), out


def test_a_timeout_shorter_than_a_start_is_refused():
    one_line_error(tutor("run", "1", "--timeout", "1e-9", env=FIX), "--timeout", "at least 1 s", code=2)


# ---- input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["run", "1", "--junit", "x.xml"], ["--junit", "bin/tutor check"]),
    (["run", "1", "--jsn", "x.json"], ["--jsn", "did you mean --json"]),
    (["run", "1", "--tiemout", "3"], ["did you mean --timeout"]),
    (["run", "1", "--count", "3"], ["not an option of run", "after `--`"]),
    (["busbw", "--bytes", "8", "--time-us", "nan", "--ranks", "2"], ["finite --time-us"]),
])
def test_what_the_runner_does_not_know_is_refused_before_a_launch(args, fragments):
    proc = tutor(*args, env=FIX)
    one_line_error(proc, *fragments, code=2)
    assert "$ " not in proc.stdout and not os.path.exists(os.path.join(ROOT, "x.json"))


def _on_a_terminal(env, *args):
    """bin/tutor's output as a terminal gets it (a pseudo-terminal), read to the end."""
    parent, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, TUTOR, *args], stdin=child, stdout=child, stderr=child,
                            env={**os.environ, **env})
    os.close(child)
    out, deadline = b"", time.monotonic() + 180
    while time.monotonic() < deadline:
        if select.select([parent], [], [], 1)[0]:
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # the child side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(parent)
    return out.decode(errors="replace")


@pytest.mark.parametrize("term", [{"TERM": "dumb"}, {"TERM": "xterm", "COLUMNS": "50"}])
def test_a_dumb_or_narrow_terminal_gets_plain_progress_lines(term):
    out = _on_a_terminal({**FIX, **term}, "check", "1", "-n", "2")
    assert "\x1b" not in out and "checking 1/1: 01_pass np=2 mpi4py" in out, repr(out)
    assert all(len(line) <= 100 for line in out.splitlines())


def test_make_help_fits_100_columns():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout
    assert "test" in out and all(len(line) <= 100 for line in out.splitlines()), out


# ---- tests that find processes find only their own ------------------------------------------------

def test_processes_running_sees_only_this_suites_processes():
    fragment = f"tutor-marker-{uuid.uuid4().hex}"
    script = f"import time; time.sleep(30)  # {fragment}"
    theirs_env = {k: v for k, v in os.environ.items() if k != "TUTOR_TEST_SESSION"}
    mine = subprocess.Popen([sys.executable, "-c", script])
    theirs = subprocess.Popen([sys.executable, "-c", script], env=theirs_env)  # another suite's
    try:
        time.sleep(0.5)
        assert processes_running(fragment) == [mine.pid]
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()


# ---- issue 38: a full temp folder, a state folder that is full or a file (M2, L1, L2) ---------------

@namespaced
def test_a_nearly_full_temp_folder_is_one_line_before_the_launch(tmp_path):
    """8 KiB free in TMPDIR, where the run folder goes: each rank's flight recorder is a mapped file,
    and a page the disk had no room for killed the rank with SIGBUS. Now: blocked, one line, nothing run."""
    d = tmp_path / "tmp"
    d.mkdir()
    proc = in_namespace(f"mount -t tmpfs -o size=64k none {d} && dd if=/dev/zero of={d}/fill bs=1k count=56 "
                        f"2>/dev/null; TMPDIR={d} $TUTOR run 1 -n 2", env=FIX)
    one_line_error(proc, "blocked: TMPDIR has 8 KiB free, 2 ranks need", "KiB", "free some space", code=4)
    assert "$ " not in proc.stdout and "SIGBUS" not in proc.stdout + proc.stderr


def test_the_space_a_run_needs_is_counted_before_the_launch(monkeypatch, tmp_path):
    """Without root (no tmpfs of our own): statvfs is made to report the free space; this checks the
    arithmetic and the line, the namespaced test above the real disk."""
    from common.runner import preflight
    real = os.statvfs(tmp_path)
    for free_blocks, refused in ((2, True), (10 ** 6, False)):
        fake = os.statvfs_result((*real[:4], free_blocks, *real[5:]))  # f_bavail
        monkeypatch.setattr(preflight.os, "statvfs", lambda path, fake=fake: fake)
        if refused:
            with pytest.raises(preflight.Blocked, match=r"has \d+ KiB free, 4 ranks need \d+ KiB"):
                preflight.check_space(4, str(tmp_path))
        else:
            preflight.check_space(4, str(tmp_path))
    assert preflight.space_needed(4) > 4 * flight.SIZE


@namespaced
def test_a_recorder_that_finds_the_disk_full_says_so_instead_of_sigbus(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    code = f"from common import flight; flight.Recorder(0, '{d}/rank0.flight')"
    proc = in_namespace(f"mount -t tmpfs -o size=64k none {d} && {FILL.format(d=d)}; "
                        f"PYTHONPATH={ROOT} {sys.executable} -c \"{code}\"")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # -7 (SIGBUS) before
    assert "NoRoom: no room for this rank's flight recorder (10 KiB)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", ["hint 01", "practice 01"])
def test_a_state_folder_that_is_a_file_is_one_line_and_writes_nothing(tmp_path, command):
    state = tmp_path / "state"
    state.write_text("a file, not a folder\n")
    proc = tutor(*command.split(), env={"TUTOR_LESSONS": PRACTICE_FIXTURES, "TUTOR_PRACTICE": str(tmp_path / "p"),
                                        "TUTOR_STATE": str(state / "sub")})
    one_line_error(proc, shown(state / "sub"), "TUTOR_STATE")  # the line is practice.py's: width not asked
    assert proc.returncode == 2 and not (tmp_path / "p").exists() and state.read_text() == "a file, not a folder\n"


@namespaced
@pytest.mark.parametrize("command", ["hint 01", "practice 01"])
def test_a_full_state_folder_is_one_line_and_writes_nothing(tmp_path, command):
    d = tmp_path / "state"
    d.mkdir()
    proc = in_namespace(f"mount -t tmpfs -o size=64k none {d} && {FILL.format(d=d)}; $TUTOR {command}; "
                        f"echo rc=$? >&2; ls -A {d} >&2",
                        env={"TUTOR_LESSONS": PRACTICE_FIXTURES, "TUTOR_PRACTICE": str(tmp_path / "p"),
                             "TUTOR_STATE": str(d)})
    assert "Traceback" not in proc.stderr and "rc=2" in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"tutor: {shown(d)}: No space left") and "nothing was changed" in first, proc.stderr
    assert not (tmp_path / "p").exists()  # the copy is not written when its progress cannot be


def test_progress_that_cannot_be_saved_is_one_line_for_every_caller(tmp_path, monkeypatch):
    """progress.change raises Unsaved: a PracticeError for hint and practice, an OSError (with its
    strerror) for check --mine, which catches those."""
    from common.runner import catalog, exercise, progress
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TUTOR_STATE", str(tmp_path / "file" / "state"))
    with pytest.raises(exercise.PracticeError) as caught:
        progress.update(catalog.resolve("01", PRACTICE_FIXTURES), state="in progress")
    assert isinstance(caught.value, OSError) and caught.value.strerror, caught.value
    assert "could not save your progress" in str(caught.value) and "\n" not in str(caught.value)


@namespaced
def test_an_output_flag_with_a_full_state_folder_leaves_no_temp_file_there(tmp_path):
    """The ledger of written files (common/plumbing/guard.py) could not be written: the file itself was, and
    nothing of the ledger's temp file may stay behind (issue 38 L2)."""
    d = tmp_path / "state"
    d.mkdir()
    out = tmp_path / "r.csv"
    proc = in_namespace(f"mount -t tmpfs -o size=64k none {d} && {FILL.format(d=d)}; "
                        f"$TUTOR run 05 -n 2 -- --csv {out}; echo LEFT: $(ls -A {d})", env={"TUTOR_STATE": str(d)})
    assert out.exists() and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr
    left = proc.stdout.split("LEFT:")[-1].split()
    assert "fill" in left and not [n for n in left if n.startswith(".written-")], left
