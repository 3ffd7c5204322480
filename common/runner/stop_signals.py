"""Nothing left running, nothing left behind, whatever ends the runner:

- a stop signal (Ctrl-C, SIGTERM from `timeout`, Slurm or CI, SIGHUP when the terminal closes, ...)
  is noted while a run is on; the runner then ends every process of the run, removes its run folder
  and exits 128 + signal (common/runner/supervise.py's wait loop);
- Ctrl-Z stops the run's processes with the runner, and `fg` (SIGCONT) continues them all;
- SIGKILL cannot be caught: mpiexec is made to die with the runner (Linux), its proxies then end the
  ranks, and the run folder it leaves is removed by the next run.
"""
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from common.runner import rank_processes
from common.runner.catalog import ROOT
from common.runner.mpi_launchers import LaunchError, allocation

# Every signal whose default action would end the runner ends the run first, then the runner, with the
# conventional status 128 + signal; SIGINT (Ctrl-C) is one of them (130). A signal ignored when the
# runner started (nohup's SIGHUP) stays ignored. SIGKILL and SIGSTOP cannot be caught.
STOP_SIGNALS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1",
                                                   "SIGUSR2", "SIGALRM", "SIGXCPU", "SIGXFSZ", "SIGVTALRM",
                                                   "SIGPROF") if hasattr(signal, name)]


class Stop:
    """While a run is on, a stop signal is noted (never raised mid-cleanup); the wait loop acts on it.
    Ctrl-Z (SIGTSTP) stops the run's processes with the runner (mpiexec and the ranks are in sessions
    of their own, out of the terminal's reach) and SIGCONT goes on with them; `paused` is the time
    spent stopped, which the watchdog does not count."""

    def __init__(self):
        self.signum, self.old, self.pid, self.paused = None, {}, None, 0.0

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS + [signal.SIGTSTP]:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.old[sig] = signal.signal(sig, self._pause if sig == signal.SIGTSTP else self._note)
        return self

    def watch(self, pid):
        """The run's mpiexec: what Ctrl-Z stops along with the runner."""
        self.pid = pid

    def _note(self, signum, frame):
        self.signum = self.signum or signum

    def _pause(self, signum, frame):
        run = [self.pid, *rank_processes.descendants(self.pid)] if self.pid else []
        for pid in reversed(run):  # the ranks first, then their launcher
            _send(pid, signal.SIGSTOP)
        since = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)  # the runner stops here, as Ctrl-Z means; SIGCONT goes on
        for pid in run:
            _send(pid, signal.SIGCONT)
        self.paused += time.monotonic() - since

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def _send(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _libc_prctl():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
PR_SET_PDEATHSIG = 1


def die_with_runner():
    """A preexec_fn for mpiexec: the kernel kills it when the runner dies, even of SIGKILL (which no
    handler sees); hydra's proxies then end the ranks when their mpiexec is gone. None off Linux."""
    if not _PRCTL:
        return None
    runner_pid = os.getpid()

    def arm():
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != runner_pid:  # the runner died before the line above: follow it now
            os._exit(137)
    return arm


def _pid_namespace():
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_PID_NS = _pid_namespace()  # a run folder names its runner as host.namespace.pid
_HOST = re.sub(r"[^\w.-]", "_", socket.gethostname())[:40] or "host"


def run_root():
    """Where run folders go: the temp directory on one machine (fast, private); a folder every node
    sees when the ranks may run on other nodes (MPIEXEC set, as for a cluster or the test bed, or inside
    a Slurm allocation), whose /tmp is their own: $TUTOR_RUN_ROOT, else runs/ in the kit's state folder
    (.tutor/ in the checkout)."""
    if os.environ.get("TUTOR_RUN_ROOT"):
        return os.environ["TUTOR_RUN_ROOT"]
    if os.environ.get("MPIEXEC") or allocation():  # inside a Slurm allocation the ranks go to its nodes
        return os.path.join(os.environ.get("TUTOR_STATE") or os.path.join(ROOT, ".tutor"), "runs")
    return tempfile.gettempdir()


def new_run_dir():
    """A fresh run folder (run_root()), after removing those orphaned by a killed runner. Its name holds
    this host, pid namespace and pid: a shared folder holds the runs of other hosts too."""
    root = run_root()
    given = os.environ.get("TUTOR_RUN_ROOT")
    if given and not os.path.isdir(given):  # the learner's folder: named, never made
        raise LaunchError(f"TUTOR_RUN_ROOT={given}: no such folder; make it (one every node sees) or unset it")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot make {root}: {exc.strerror}; set TUTOR_RUN_ROOT (a folder every node "
                          "sees)") from None
    _sweep_orphans(root)
    return tempfile.mkdtemp(prefix=f"tutor-run-{_HOST}.{_PID_NS}.{os.getpid()}-", dir=root)


def _sweep_orphans(folder):
    """Remove run folders whose runner is gone (one killed by SIGKILL could not remove its own); only
    those of runners on this host in this pid namespace, the only ones whose pid can be looked up here."""
    try:
        names = os.listdir(folder) if _PID_NS else []
    except OSError:
        return
    for name in names:
        m = re.fullmatch(rf"tutor-run-{re.escape(_HOST)}\.{_PID_NS}\.(\d+)-\w+", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
