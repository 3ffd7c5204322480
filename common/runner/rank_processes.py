"""The runner's half of the watchdog: what the ranks left in the run folder, and ending them all.

Each rank (common/plumbing/watchdog.py) writes rankR.pid, dumps its stack to rankR.stack on SIGUSR1
and its uncaught error to rankR.error, all in the run folder (common/plumbing/run_folder.py). Ranks run
in sessions of their own (MPICH's hydra calls setsid), so killing mpiexec's process group is not enough:
end_tree also ends mpiexec's descendants and every rank whose environment names this run's folder.
"""
import os
import re
import signal
import time

from common.plumbing import run_folder
from common.runner.catalog import ROOT


def descendants(pid):
    """Every process below `pid` (from /proc), deepest last."""
    children = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _per_rank(run_dir, kind):
    """{rank: text} of the run folder's rankR.KIND files (one a rank is still writing is skipped)."""
    found = {}
    for rank, path in run_folder.rank_files(run_dir, kind).items():
        try:
            with open(path) as f:
                found[rank] = f.read().strip()
        except OSError:
            pass
    return found


def rank_pids(run_dir):
    return {r: int(t) for r, t in _per_rank(run_dir, "pid").items() if t.isdigit()}


def dump_stacks(pid, run_dir, wait=3.0):
    """Ask every rank for a faulthandler dump (SIGUSR1) and parse where each one is blocked. A rank that
    cannot answer (stopped with SIGSTOP) gets one pseudo-frame (what, "") naming its process state."""
    ranks = {r: p for r, p in rank_pids(run_dir).items() if _ours(p, run_dir)}
    for rank_pid in ranks.values():
        _signal(rank_pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait
    stacks = {}
    while time.monotonic() < deadline and len(stacks) < len(ranks):
        time.sleep(0.1)
        for rank in ranks:
            path = run_folder.rank_file(run_dir, rank, "stack")
            frames = parse_stack(open(path).read()) if os.path.exists(path) else []
            if frames:
                stacks[rank] = frames
    for rank, rank_pid in ranks.items():  # no dump: say what the process was doing instead
        if rank not in stacks:
            state = (_stat(rank_pid) or ["?"])[0]
            why = {"T": "stopped", "t": "stopped by a debugger", "D": "waiting on a disk or device",
                   "Z": "already gone"}.get(state, "did not answer the stack-dump request")
            stacks[rank] = [(f"{why}, state {state} (pid {rank_pid})", "")]
    return stacks


_FRAME = re.compile(r'File "(.+)", line (\d+) in (\S+)')


def parse_stack(text):
    """[(function, file:line)] of the current (main) thread, innermost first, from a faulthandler dump."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip())
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    return [(fn, f"{os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}:{line}")
            for path, line, fn in _FRAME.findall(main)]


def blocked_at(frames):
    """The innermost frame in the kit's own files (the lesson's line), and the innermost overall."""
    own = next((f for f in frames if not f[1].startswith(("/", "<"))), None)
    return own, frames[0] if frames else None


def read_errors(run_dir):
    return _per_rank(run_dir, "error")


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _ours(pid, run_dir):
    """True if process `pid` is a rank of this run (its environment names our run folder)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{run_folder.ENV}={run_dir}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def end_tree(proc, run_dir):
    """SIGKILL mpiexec, everything below it, and every rank of this run: nothing is left."""
    victims = [p for p in rank_pids(run_dir).values() if _ours(p, run_dir)]
    # ranks that had not written their pid yet: Open MPI's ranks outlive a killed mpiexec (prterun)
    victims += [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in victims
                and int(e) != os.getpid() and _ours(int(e), run_dir)]
    if proc.poll() is None:
        victims += descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for victim in victims:
        _signal(victim, signal.SIGKILL)
    _wait_gone(victims)


def _wait_gone(pids, limit=10.0):
    """Return once every pid has exited (a zombie counts: it runs nothing). SIGKILL is not instant:
    a big process takes a while to release its memory, and "ended" must mean ended."""
    deadline = time.monotonic() + limit
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def _alive(pid):
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def cpu_and_state(run_dir):
    """{rank: (CPU seconds so far, state letter)} of the run's ranks this machine can see (/proc): a
    rank on another node, or gone, is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for rank, pid in rank_pids(run_dir).items():
        fields = _stat(pid) if _ours(pid, run_dir) else None
        if fields and len(fields) > 12:
            found[rank] = ((int(fields[11]) + int(fields[12])) / tick, fields[0])
    return found


def _stat(pid):
    """/proc/PID/stat after the command name: [state, ppid, ...]; None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
