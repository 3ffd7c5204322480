"""What `bin/tutor run` and `check` do: validate the request, launch, check the results (the words
for an outcome are common/runner/verdict.py's; the files the runner writes follow common/runner/files.py)."""
import json
import os

from common import devices
from common.runner import expect, files, launch, schema
from common.runner.verdict import checks_table, explain, killed_rank, ok, status, write_junit  # noqa: F401

RUNNER_FLAGS = ("--api", "--device", "--json")  # the lesson's flags the runner sets itself


class UsageError(ValueError):
    """Bad input: one line for the learner, exit status 2."""


class ScriptError(ValueError):
    """The lesson (or practice copy) cannot even be compiled: one line with file:line, exit status 1."""


def np_ceiling():
    """The most ranks this machine runs without --force: 4 per usable core, at least 8. None when
    MPIEXEC is set (a cluster launcher: the ranks may go to other nodes, whose cores are not ours)."""
    return None if os.environ.get("MPIEXEC") else max(8, 4 * launch.usable_cores())


def parse_np(text, lesson, force=False):
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
    ceiling = np_ceiling()
    if ceiling and np > ceiling and not force:
        raise UsageError(f"-n {np}: more ranks than {launch.usable_cores()} cores run sensibly (at most "
                         f"{ceiling}); add --force to run them anyway")
    return np


def parse_timeout(value):
    """--timeout: a finite number of seconds > 0, at most a day; None keeps the YAML's."""
    if value is not None and not 0 < value <= schema.MAX_TIMEOUT_S:  # nan and inf fail this too
        raise UsageError(f"--timeout must be positive, at most {schema.MAX_TIMEOUT_S} s (a day): got "
                         f"{value} (the watchdog cannot be switched off)")
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
    shown = os.path.relpath(path)
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
        files.check_target(path, "--json", "results JSON", files.is_results_json)
    except files.FileError as exc:
        raise UsageError(str(exc)) from None


def check_junit_target(path):
    try:
        files.check_target(path, "--junit", "JUnit report", files.is_junit)
    except files.FileError as exc:
        raise UsageError(str(exc)) from None


def validate(lesson, np, api, device):
    """The pre-flight checks that need no MPI: API offered, device possible on this machine."""
    if api not in lesson.meta["apis"]:
        raise UsageError(f"{lesson.name} offers --api {' or '.join(lesson.meta['apis'])}, not {api!r}")
    if device not in devices.DEVICES:
        raise UsageError(f"--device must be auto, cpu or gpu, not {device!r}")
    if lesson.needs_gpu and device == "cpu":
        raise UsageError(f"{lesson.name} needs a GPU; it has no --device cpu path")
    if device == "gpu" or lesson.needs_gpu:
        n, why = devices.visible_gpus()
        local = np if not os.environ.get("MPIEXEC") else 1  # across nodes only the ranks can tell
        if n == 0:
            raise UsageError(f"--device gpu: no usable GPU here ({why}); use --device cpu or auto")
        if local > n:
            raise UsageError(f"--device gpu: {np} ranks but {n} GPU(s) on this node; NCCL needs one GPU "
                             "per rank (lower -n or use --device cpu)")


def run_lesson(lesson, np, api, device, extra=(), json_path=None, timeout=None, echo=True, script=None,
               tick=None):
    """Launch one lesson; return (outcome, checks). checks is None when there were no results.
    With json_path, the results (and the checks and status) are kept there: see common/runner/files.py."""
    extra = [str(a) for a in extra]
    check_extra(extra)
    if json_path:
        check_json_target(json_path)
    args = ["--api", api, "--device", device, *extra]
    cmd = launch.command(script or lesson.path, np, args)
    if echo:
        print("$ " + " ".join(cmd), flush=True)
        if np > launch.usable_cores():
            print(f"note: {np} ranks share {launch.usable_cores()} usable cores, so timings will be "
                  "distorted (results are still checked)", flush=True)
    outcome = launch.run(cmd, timeout or lesson.meta["timeout_s"], echo=echo, tick=tick)
    checks = expect.run_checks(lesson.meta["expect"], outcome.results) if outcome.results else None
    if json_path:
        keep_results(json_path, lesson, np, api, device, outcome, checks)
    return outcome, checks


def keep_results(path, lesson, np, api, device, outcome, checks):
    """The results JSON the learner asked for: the lesson's results (or what is known of the run),
    the checks and one status; never over a file that is not an earlier one (UsageError)."""
    doc = outcome.results or {"lesson": lesson.name, "np": np, "api": api, "device": device, "ranks": []}
    doc = {**doc, "checks": checks or [], "ok": ok(outcome, checks), "status": status(outcome, checks)}
    text = json.dumps(doc, indent=1) + "\n"
    try:
        files.write_new(path, text, "--json", "results JSON", files.is_results_json)
    except files.FileError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--json {path}: could not write it: {exc.strerror}") from None


def lesson_help(lesson, script=None):
    """The lesson's own --help, once (one rank), with no verdict: the exit status of the lesson."""
    cmd = launch.command(script or lesson.path, 1, ["--help"])
    print("$ " + " ".join(cmd), flush=True)
    return launch.run(cmd, 60).rc


class Waiting:
    """Says, on stderr, that a quiet run is still going: at 5 s (or half its limit), then each time
    the wait doubles, so a learner whose answer deadlocks knows why nothing happens."""

    def __init__(self, what, limit, say):
        self.what, self.limit, self.say = what, limit, say
        self.next = min(5.0, limit / 2)

    def __call__(self, seconds):
        if seconds >= self.next:
            self.say(f"  … {self.what}: still running after {seconds:.0f} s (limit {self.limit:g} s; "
                     "a deadlock? Ctrl-C stops it)")
            self.next = 2 * seconds
