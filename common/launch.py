"""Start a lesson under mpiexec, show its output live, and make sure it ends: timeout, Ctrl-C, cleanup
(the run folder's pids, stacks and errors, and the killing, live in common/rundir.py).
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from common.catalog import ROOT
from common.rundir import dump_stacks, end_tree, rank_pids, read_errors


class LaunchError(RuntimeError):
    pass


def mpiexec(np):
    """The launcher's argv: $MPIEXEC if set, else the venv's MPICH mpiexec."""
    custom = os.environ.get("MPIEXEC")
    if custom:
        argv = shlex.split(custom)
        if not argv or not shutil.which(argv[0]):
            raise LaunchError(f"MPIEXEC={custom!r}: {argv[0] if argv else 'nothing'} is not a program "
                              "found on PATH")
        if _is_open_mpi(argv[0]):
            if np > (os.cpu_count() or 1) and "--oversubscribe" not in argv:
                argv.append("--oversubscribe")
            if os.geteuid() == 0 and "--allow-run-as-root" not in argv:
                argv.append("--allow-run-as-root")
        return argv
    venv = os.path.join(ROOT, ".venv", "bin", "mpiexec")
    if not os.access(venv, os.X_OK):
        raise LaunchError("mpiexec not found in .venv: run `make setup` (or set MPIEXEC)")
    return [os.path.relpath(venv)]


def _is_open_mpi(program):
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=10)
        return "Open MPI" in out.stdout + out.stderr or "OpenRTE" in out.stdout
    except (OSError, subprocess.SubprocessError):
        return False


def python():
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return os.path.relpath(venv) if os.path.exists(venv) else sys.executable


def command(script, np, args=()):
    return [*mpiexec(np), "-n", str(np), python(), "-m", "mpi4py", os.path.relpath(script), *args]


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class Outcome:
    rc: int
    seconds: float
    timed_out: bool = False
    interrupted: bool = False
    results: dict = None
    stacks: dict = field(default_factory=dict)   # rank -> [(func, file:line), ...] innermost first
    errors: dict = field(default_factory=dict)   # rank -> "ValueError: ... (file:line)"
    tail: list = field(default_factory=list)     # last lines of output
    pids: dict = field(default_factory=dict)     # rank -> pid, as the ranks wrote them
    limit: float = None                          # the timeout this run had


def run(cmd, timeout, results_path=None, echo=True, env=None):
    """Run `cmd`; stream its output; end it at `timeout` with per-rank stacks; return an Outcome."""
    run_dir = tempfile.mkdtemp(prefix="tutor-run-")
    results_path = results_path or os.path.join(run_dir, "results.json")
    if os.path.exists(results_path):
        os.unlink(results_path)  # never read a previous run's results as this one's
    env = {**os.environ, **(env or {}), "TUTOR_RUN_DIR": run_dir,
           "TUTOR_RESULTS": os.path.abspath(results_path), "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"cannot start {cmd[0]}: {exc.strerror}") from None
    out = Outcome(rc=0, seconds=0.0, limit=timeout)
    reader = threading.Thread(target=_pump, args=(proc.stdout, out.tail, echo), daemon=True)
    reader.start()
    try:
        out.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        out.timed_out = True
        out.stacks = dump_stacks(proc.pid, run_dir)
        out.rc = 124
    except KeyboardInterrupt:
        out.interrupted = True
        out.rc = 130
    finally:
        end_tree(proc, run_dir)
        proc.wait()
        reader.join(timeout=5)
    out.seconds = time.monotonic() - start
    out.errors = read_errors(run_dir)
    out.pids = rank_pids(run_dir)
    if os.path.exists(results_path) and not (out.timed_out or out.interrupted):
        with open(results_path) as f:
            out.results = json.load(f)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def _pump(stream, tail, echo):
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
        tail.append(line.rstrip("\n"))
        del tail[:-200]
