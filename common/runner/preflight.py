"""Everything `bin/tutor run` and `check` decide before launching: the request (UsageError, exit 2),
the lesson's source (ScriptError, a crash, exit 3), and what this machine must have (Blocked, exit 4)."""
import functools
import importlib.util
import os
import sys
import tempfile

from common import flight, timing
from common.plumbing import devices, guard
from common.runner import mpi_launchers, output_files, schema, stop_signals
from common.text import path_shown

RUNNER_FLAGS = ("--api", "--device", "--json")  # the lesson's flags the runner sets itself


class UsageError(ValueError):
    """Bad input: one line for the learner, exit status 2."""


class ScriptError(ValueError):
    """The lesson (or practice copy) cannot even be compiled: one line with file:line, a crash (3)."""


class Blocked(ValueError):
    """What the run needs is missing on this machine (a GPU, a library, cores for -n): one line,
    exit status 4; nothing is launched."""


def np_ceiling():
    """The most ranks this machine runs without --force: 4 per usable core, at least 8; inside a Slurm
    allocation, 4 per CPU it holds. None when MPIEXEC is set outside one (a cluster launcher: the ranks
    may go to other nodes, whose cores are not ours)."""
    if mpi_launchers.allocation():
        return max(8, 4 * mpi_launchers.cores()[0])
    return None if os.environ.get("MPIEXEC") else max(8, 4 * timing.usable_cores())


def parse_np(text, lesson):
    if text is None:
        return lesson.meta["np"]["default"]
    try:
        np = int(str(text).strip())
    except ValueError:
        raise UsageError(f"NP must be a whole number, got {text!r}") from None
    lo, hi = lesson.np_range
    if np < 1:
        raise UsageError(f"NP must be at least 1, got {np}")
    if np < lo or (hi is not None and np > hi):
        span = f"{lo}..{hi}" if hi is not None else f"at least {lo}"
        raise UsageError(f"{lesson.name} runs with NP {span}, got {np}")
    return np


MIN_TIMEOUT_S = 1.0  # mpiexec and a Python per rank take about that to start: less times out at once


def parse_timeout(value):
    """--timeout: a finite number of seconds, at least MIN_TIMEOUT_S, at most a day; None keeps the YAML's."""
    if value is not None and 0 < value < MIN_TIMEOUT_S:
        raise UsageError(f"--timeout {value:g} s is shorter than a run takes to start: give at least "
                         f"{MIN_TIMEOUT_S:g} s")
    if value is not None and not 0 < value <= schema.MAX_TIMEOUT_S:  # nan and inf fail this too
        raise UsageError(f"--timeout must be positive, at most {schema.MAX_TIMEOUT_S} s, not {value:g} (the "
                         "watchdog cannot be switched off)")
    return value


def wants_help(extra):
    """True when the lesson flags after `--` ask for the lesson's own --help."""
    return any(a in ("-h", "--help") or len(a) > 3 and "--help".startswith(a) for a in _flags(extra))


def check_extra(extra):
    """Refuse lesson flags that would override the runner's own behind its back (the summary and
    the results would then describe another run than the one made)."""
    for arg in _flags(extra):
        taken = [f for f in RUNNER_FLAGS if len(arg) > 2 and f.startswith(arg)]
        if taken:
            raise UsageError(f"`{arg}` after `--` would override the runner's {taken[0]}: give it to "
                             "bin/tutor, before `--`")


def _flags(extra):
    return [str(a).split("=", 1)[0] for a in extra if str(a).startswith("-")]


def check_script(path):
    """Compile the lesson (or the learner's copy) before launching NP copies of a syntax error."""
    shown = path_shown(path)
    try:
        with open(path, "rb") as f:
            compile(f.read(), shown, "exec", dont_inherit=True)
    except OSError as exc:
        raise ScriptError(f"{shown}: {exc.strerror}") from None
    except SyntaxError as exc:  # IndentationError and TabError too
        code = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
        raise ScriptError(f"{shown}:{exc.lineno}: {type(exc).__name__}: {exc.msg}{code}") from None
    except ValueError as exc:  # e.g. a NUL byte
        raise ScriptError(f"{shown}: {exc}") from None


def check_json_target(path):
    try:
        output_files.check_target(path, "--json", "results JSON", guard.is_results_json)
    except output_files.FileError as exc:
        raise UsageError(str(exc)) from None


def check_junit_target(path):
    try:
        output_files.check_target(path, "--junit", "JUnit report", guard.is_junit)
    except output_files.FileError as exc:
        raise UsageError(str(exc)) from None


def check_request(lesson, np, api, device):
    """The request itself: API offered, a device word, a device the lesson has (UsageError)."""
    if api not in lesson.meta["apis"]:
        raise UsageError(f"{lesson.name} offers --api {' or '.join(lesson.meta['apis'])}, not {api!r}")
    if device not in devices.DEVICES:
        raise UsageError(f"--device must be auto, cpu or gpu, not {device!r}")
    if lesson.needs_gpu and device == "cpu":
        raise UsageError(f"{lesson.name} needs a GPU; it has no --device cpu path")


@functools.lru_cache(maxsize=1)
def _gpus():
    return devices.visible_gpus()  # one nvidia-smi per command, however many runs `check` plans


def needs(lesson, np, api, device, force=False):
    """What this machine must have for the run, checked before launching (Blocked when it lacks it):
    cores for np ranks, a GPU per local rank, the libraries the path imports (looked up, not imported)."""
    ceiling = np_ceiling()
    if ceiling and np > ceiling and not force:
        cores, what = mpi_launchers.cores()
        raise Blocked(f"-n {np} is more ranks than {cores} {what.replace('usable ', '')} run sensibly (at most "
                      f"{ceiling}); --force runs it anyway")
    refusal = mpi_launchers.pmi_check()  # srun with a PMI the ranks' MPI does not speak: worlds of one
    if refusal:
        raise Blocked(refusal)
    gpu = device == "gpu" or lesson.needs_gpu
    if gpu:
        n, why = _gpus()
        local = np if not (os.environ.get("MPIEXEC") or mpi_launchers.allocation()) else 1  # only the ranks can tell
        if n == 0:
            raise Blocked(f"{why}; " + ("this lesson needs a GPU" if lesson.needs_gpu else "use --device cpu"))
        if local > n:
            raise Blocked(f"{np} ranks, {n} GPU(s) here: NCCL needs one GPU per rank; lower -n or use "
                          "--device cpu")
    for base in ("mpi4py", "numpy"):  # every lesson's: else the ranks die at import, under MPI's banner
        if importlib.util.find_spec(base) is None:
            raise Blocked(f"{path_shown(sys.executable)} cannot import {base}, which every lesson needs: "
                          f"install it there (pip install {base})")
    check_space(np)
    wanted = (["torch"] if api == "torch" else []) + (["cupy"] if gpu and api == "mpi4py" else [])
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if missing:
        other = "use --api mpi4py" if "torch" in missing else "use --device cpu"
        flag = "--api torch" if missing[0] == "torch" else "--device gpu"
        raise Blocked(f"this Python cannot import {missing[0]} (for {flag}); "
                      f"install it or {other}")


RUN_FILES_B = 64 << 10  # beside the ranks' files: the results JSON, the launcher's (hydra's hwloc XML)


def space_needed(np, block=4096):
    """Bytes a run of np ranks takes in its run folder: each rank's flight recorder (common/flight.py,
    a file mapped into memory) and its pid and stack files, in whole blocks, and the run's own files."""
    per_rank = (-(-flight.SIZE // block) + 2) * block
    return np * per_rank + RUN_FILES_B


def check_space(np, folder=None):
    """Blocked (one line) when the temp folder the run folder goes in has too little room: a rank whose
    mapped flight recorder finds the disk full is killed by SIGBUS, with no word of why."""
    folder = folder or stop_signals.run_root()
    setting = "TMPDIR" if folder == tempfile.gettempdir() else "TUTOR_RUN_ROOT"
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:  # runs/ not made yet
        folder = os.path.dirname(folder)
    try:
        fs = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs (Windows) or no folder: the run says what it finds
        return
    block = fs.f_frsize or fs.f_bsize or 4096
    need, free = space_needed(np, block), fs.f_bavail * block
    if free < need:
        where = setting if os.environ.get(setting) else path_shown(folder)  # the path may be long
        raise Blocked(f"{where} has {free >> 10} KiB free, {np} rank{'s' * (np > 1)} need {need >> 10} KiB "
                      "(flight recorders): free some " + ("space" if where == setting else f"or set {setting}"))
