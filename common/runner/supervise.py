"""Start a lesson under mpiexec, show its output live, and make sure it ends: timeout, stop signals,
cleanup (the run folder's pids, stacks and errors, and the killing, live in common/runner/rank_processes.py; what
ends the run when the runner itself is told to stop, in common/runner/stop_signals.py).
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from common.plumbing import run_folder
from common.runner import flightwatch, stop_signals
from common.runner.catalog import ROOT
from common.runner.mpi_launchers import LaunchError, flavour, mpiexec, python
from common.runner.rank_processes import dump_stacks, end_tree, rank_pids, read_errors


def command(script, np, args=()):
    """The whole launch line. With hydra it asks for every rank's exit status (see hydra_statuses)."""
    launcher = mpiexec(np)
    if flavour(launcher[0]) == "hydra" and HYDRA_ALL_CODES not in launcher:
        launcher.append(HYDRA_ALL_CODES)
    return [*launcher, "-n", str(np), python(), "-m", "mpi4py", os.path.relpath(script, ROOT), *args]


# When one rank dies, hydra kills the others, with SIGKILL, and its "BAD TERMINATION ... PID" banner
# names the first rank it finds with a bad status: now and then that is a rank it killed itself.
# This flag makes it print every rank's wait status, one line the runner takes out of the output.
HYDRA_ALL_CODES = "-print-all-exitcodes"
_EXIT_CODES = re.compile(r"^\[mpiexec@[^\]]*\] Exit codes: (.*)$")
_HOST_CODES = re.compile(r"^\[[^\]]+\] [\d,]+$")


def hydra_statuses(line):
    """Each rank's wait status from hydra's 'Exit codes:' line, rank order; None if it is not that
    line, or names several hosts (its order is then by host, which the runner cannot map to ranks)."""
    m = _EXIT_CODES.match(line.strip())
    hosts = re.findall(r"\[[^\]]+\] ([\d,]+)", m.group(1)) if m else []
    return [int(x) for x in hosts[0].split(",")] if len(hosts) == 1 else None


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
    statuses: list = None                        # each rank's wait status, when hydra reported them
    limit: float = None                          # the timeout this run had
    signal: int = None                           # the signal that interrupted the runner
    launcher: tuple = None                       # (pid, signal) when mpiexec itself was killed
    bad_results: str = None                      # why the results file could not be read
    blocked: str = None                          # why the lesson refused: what it needs is missing here
    ran: set = field(default_factory=set)        # exercise regions a practice run reached (practice_grading.py)
    wrong_world: str = None                      # the ranks were not -n ranks in one world (common/plumbing/world.py)
    diagnosis: dict = None                       # the first divergence of the ranks' flight records
    planted: dict = None                         # the fault a lesson planted on purpose (lesson 14)
    stuck: float = None                          # ended early: seconds every rank waited, nothing moving
    held: dict = field(default_factory=dict)     # a planted fault's run: error output not shown, by writer


def supervise(cmd, timeout, echo=True, env=None, tick=None):
    """Run `cmd`; stream its output; end it at `timeout` (with per-rank stacks) or on a stop signal;
    return an Outcome once every process of the run is gone and its run folder removed. `tick(seconds)`
    is called about every 0.1 s while it runs. The lesson writes its results into the run folder.
    `cmd` may be a function of the run folder that returns the command (and may put a script there)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise LaunchError(f"a run needs a finite timeout > 0, got {timeout!r}")  # the watchdog stays on
    with stop_signals.Stop() as stop:
        run_dir = stop_signals.new_run_dir()
        try:
            return _run(cmd, timeout, run_dir, stop, echo, env, tick)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def _run(cmd, timeout, run_dir, stop, echo, env, tick):
    cmd = cmd(run_dir) if callable(cmd) else cmd
    results_path = run_folder.results(run_dir)
    # one BLAS / OpenMP thread per rank unless the learner set a number: N ranks that each start a thread
    # per core spin against each other (a 32x256 @ 256x256 matmul took 19x as long at NP 4 on 2 cores)
    threads = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    # the launcher's and the ranks' temp files go in the run folder, removed with it. Open MPI keeps its
    # session in $TMPDIR/ompi.<launcher pid>; one a killed run left behind makes a later launcher that
    # gets the same pid fail at start ("The PMIx server's listener thread failed to start", exit 213)
    scratch = run_folder.scratch(run_dir)
    os.mkdir(scratch)
    env = {**threads, **os.environ, **(env or {}), run_folder.ENV: run_dir, "TMPDIR": scratch,
           "TUTOR_RESULTS": results_path, "PYTHONUNBUFFERED": "1"}
    out = Outcome(rc=0, seconds=0.0, limit=timeout)
    watch, polled, early = flightwatch.Watch(run_dir), 0.0, False
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=stop_signals.die_with_runner())
    except OSError as exc:
        raise LaunchError(f"cannot start {cmd[0]}: {exc.strerror}") from None
    stop.watch(proc.pid)  # Ctrl-Z stops the run with the runner (stop_signals.Stop)
    reader = threading.Thread(target=_pump, args=(proc.stdout, out, echo, run_dir), daemon=True)
    reader.start()
    try:
        while True:
            try:
                out.rc = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:  # raised by a SIGINT handler other than ours
                stop.signum = signal.SIGINT
            if stop.signum:
                out.interrupted, out.signal, out.rc = True, stop.signum, 128 + stop.signum
                break
            ran = time.monotonic() - start - stop.paused
            if ran - polled >= 0.25:  # a planted fault's run ends once stuck (common/runner/flightwatch.py)
                polled, early = ran, watch.poll(ran)
            if ran >= timeout or early:
                out.timed_out = True
                watch.before()
                out.stacks = dump_stacks(proc.pid, run_dir)
                out.rc = 124
                break
            if tick:
                tick(time.monotonic() - start)
    finally:
        end_tree(proc, run_dir)
        proc.wait()
        reader.join(timeout=5)
    if out.rc < 0:  # mpiexec itself died of a signal: what sent it cannot be known from here
        out.launcher, out.rc = (proc.pid, -out.rc), 128 - out.rc
    if stop.signum and not out.interrupted:  # it came while the run was being ended: still obeyed
        out.interrupted, out.signal, out.rc = True, stop.signum, 128 + stop.signum
    out.seconds = time.monotonic() - start
    out.errors = read_errors(run_dir)
    out.pids = rank_pids(run_dir)
    out.held = {**held_stderr(run_dir), **out.held}
    watch.finish(out, len(out.pids))
    out.ran = run_folder.ran_regions(run_dir)
    if os.path.exists(run_folder.wrong_world(run_dir)):  # a process found itself in the wrong world
        with open(run_folder.wrong_world(run_dir)) as f:
            out.wrong_world = f.read().strip() or "wrong world: the ranks were not one world of -n"
    if os.path.exists(run_folder.blocked(run_dir)):  # the lesson found no GPU per rank
        with open(run_folder.blocked(run_dir)) as f:
            out.blocked = f.read().strip() or "what the run needs is missing here"
    if os.path.exists(results_path) and not (out.timed_out or out.interrupted):
        try:
            with open(results_path) as f:
                out.results = json.load(f)
        except (OSError, ValueError) as exc:
            out.bad_results = str(exc)
        if not isinstance(out.results, dict):
            out.results, out.bad_results = None, out.bad_results or "not a JSON object"
    return out


# A launcher's report of a rank that died opens with a rule of '=' (hydra) or '-' (Open MPI)
_BANNER = re.compile(r"^\s*(={20,}|-{20,})\s*$")


def held_stderr(run_dir):
    """{"rank R": text} of what a planted fault's ranks wrote to stderr (rankR.stderr, lesson 14 puts
    it there): the library's error stack, tracebacks, said in one line under the diagnosis instead."""
    held = {}
    for rank, path in run_folder.rank_files(run_dir, "stderr").items():
        try:
            with open(path, "rb") as f:
                text = f.read(1 << 20).decode(errors="replace").replace("\x00", "")
        except OSError:
            continue
        if text.strip():
            held[f"rank {rank}"] = text
    return held


def _pump(stream, out, echo, run_dir=None):
    codes = False  # within hydra's 'Exit codes:' report, which gives each further host a line
    banner = []  # a planted fault's run: the launcher's report from its first rule on, held back
    for raw in iter(stream.readline, b""):
        # Open MPI's launcher writes stray NUL bytes (one ends its crash report): nothing a person reads,
        # and one left at the end of the output would lead the runner's own next line
        line = raw.decode(errors="replace").replace("\x00", "")
        if not line:
            continue
        if not line.endswith("\n"):  # the output's last words, unended: the runner's lines go below them
            line += "\n"
        statuses = hydra_statuses(line)
        if statuses is not None:
            out.statuses, codes = statuses, True
            continue
        if codes and _HOST_CODES.match(line.strip()):
            out.statuses = None  # several hosts: listed by host, which the runner cannot map to ranks
            continue
        codes = False
        out.tail.append(line.rstrip("\n"))
        del out.tail[:-200]
        if not banner and run_dir and _BANNER.match(line) and os.path.exists(run_folder.planted(run_dir)):
            out.held["mpiexec"] = banner
        if out.held.get("mpiexec") is banner:  # said in one line under the diagnosis (flightwatch.ending)
            banner.append(line.rstrip("\n"))
            continue
        if echo:
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            except (OSError, ValueError):  # the terminal is gone (SIGHUP): keep reading, stop showing
                echo = False
