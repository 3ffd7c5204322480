"""What `bin/tutor run` and `check` share: one lesson launched and its results checked (run_lesson), the
command shown, what a quiet run is doing (Waiting). The words for an outcome are common/runner/verdict.py's."""
import os
import re
import shlex

from common.plumbing import run_folder
from common.runner import flightwatch, mpi_launchers, practice_grading, supervise, yaml_checks
from common.runner.catalog import ROOT
from common.runner.diagnose import stuck, where
from common.runner.preflight import check_extra
from common.runner.verdict import expected_death, status
from common.text import by_message, ranks_of

SANITIZED_SLOWER = 3  # --sanitize (NCCL's order: a token each way per transfer) gets 3x the YAML's limit


def sanitized(extra=()):
    """True when the run is sanitized with NCCL's order (--sanitize, or TUTOR_SANITIZE=1 inherited);
    a practice run's buffers-only mode costs a checksum per buffer and keeps the YAML's limit."""
    return "--sanitize" in map(str, extra) or os.environ.get("TUTOR_SANITIZE") == "1"


def limit(lesson, extra=()):
    """Seconds one run of `lesson` may take: its YAML's timeout_s, times SANITIZED_SLOWER when sanitized.
    Lesson 15 on torch at NP 6 took 28-71 s sanitized here against 16 s plain (2 cores, loaded)."""
    return lesson.meta["timeout_s"] * (SANITIZED_SLOWER if sanitized(extra) else 1)


def run_lesson(lesson, np, api, device, extra=(), timeout=None, echo=True, script=None, tick=None, splice=None):
    """Launch one lesson (or `script`, or a practice_grading.Splice); return (outcome, checks). checks is
    None when there were no results."""
    extra = [str(a) for a in extra]
    check_extra(extra)
    if device == "auto" and lesson.meta.get("devices") == ["cpu"]:  # auto never picks what it cannot run
        device = "cpu"
    args = ["--api", api, "--device", device, *extra]
    line = mpi_launchers.survivable if lesson.meta.get("expects_death") else (lambda c: c)  # a rank dies on purpose
    cmd, env, launched = line(supervise.command(script or lesson.path, np, args)), mpi_launchers.world_env(np), []
    if splice:  # the graded text goes in the run folder; common/ is found through PYTHONPATH
        def cmd(run_dir):
            os.mkdir(run_folder.mine(run_dir))
            launched.append(os.path.join(run_folder.mine(run_dir), os.path.basename(lesson.path)))
            with open(launched[0], "w") as f:
                f.write(splice.text)
            return line(supervise.command(launched[0], np, args))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
        # a practice copy runs sanitized (common/sanitize.py): a racy answer that got lucky fails every
        # time. Buffer hazards only: NCCL's order would stop lesson 01, whose head-to-head exchanges are
        # the lesson. TUTOR_SANITIZE=0 turns it off, =1 adds NCCL's order
        env["TUTOR_SANITIZE"] = os.environ.get("TUTOR_SANITIZE", "buffers")
    elif echo:
        print(shown(cmd), flush=True)
    if hasattr(tick, "watch"):  # the tick reads the ranks' flight records in the run folder
        given = cmd

        def cmd(run_dir):
            tick.watch(run_dir)
            return given(run_dir) if callable(given) else given
    if echo and mpi_launchers.note():
        print(mpi_launchers.note(), flush=True)
    cores, what = mpi_launchers.cores()  # inside a Slurm allocation, the CPUs it holds
    if echo and np > cores:
        print(f"note: {np} ranks share {cores} {what}, so timings will be "
              "distorted (results are still checked)", flush=True)
    outcome = supervise.supervise(cmd, timeout or limit(lesson, extra), echo=echo, env=env, tick=tick)
    if lesson.meta.get("expects_death"):
        outcome.rc = expected_death(outcome)
    if launched:
        practice_grading.relabel(outcome, splice, launched[0])
    if outcome.results and outcome.results.get("np", np) != np and not outcome.wrong_world:
        outcome.wrong_world = (f"wrong world: the results are of {outcome.results.get('np')} rank(s), "
                               f"{np} were started: mpi4py must be built for the launcher's MPI")
    if outcome.rc and not outcome.pids and not outcome.wrong_world:  # no rank joined: MPI itself failed
        outcome.wrong_world = mpi_launchers.mismatch()
    if outcome.wrong_world:  # nothing a wrong world reported is checked: it is never a pass
        outcome.results = None
    elif outcome.planted:  # lesson 14's fault: grade the diagnosis, whether the fault hung the run or not
        outcome.results = outcome.results or {"lesson": lesson.name, "np": np, "api": api, "device": device,
                                              "ranks": [], "params": outcome.planted.get("params", {})}
        outcome.results["diagnosis"] = outcome.diagnosis or {}
    checks = yaml_checks.run_checks(lesson.meta["expect"], outcome.results) if outcome.results else None
    if not outcome.interrupted:  # `bin/tutor why` (a check's too): the diagnosis, the error output kept
        flightwatch.remember(f"{lesson.name} np={np} api={api}", status(outcome, checks), outcome)
    return outcome, checks


def shown(cmd, width=100):
    """The command as a shell line to copy, continued with a backslash where it passes `width`."""
    lines, line = [], "$"
    for word in map(shlex.quote, cmd):  # a path with a space stays one word when pasted
        if len(line) + 1 + len(word) > width - 2 and line.strip() not in ("$", ""):
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    return "\n".join(lines + [line])


def lesson_help(lesson):
    """The lesson's own --help, once (one rank), with no verdict: the exit status of the lesson."""
    cmd = supervise.command(lesson.path, 1, ["--help"])
    print(shown(cmd), flush=True)
    return supervise.supervise(cmd, 60).rc


class Waiting:
    """Says, on stderr, that a quiet run is still going: at 5 s (or half its limit), then each time
    the wait doubles, with what the ranks' flight records (common/flight.py) say they are doing:
    starting (not every rank has joined, or made its first call: imports, MPI, torch's group),
    working (records moving), or where each rank is once nothing moved for STILL_S; only when every
    rank is inside a call does it ask about a deadlock. What was said is not said again ('as above').
    run_lesson tells it the run folder (watch)."""
    STILL_S = 2.0  # no record moved for this long: where each rank is gets said

    def __init__(self, what, limit, say, np=None):
        self.what, self.limit, self.say, self.np = what, limit, say, np
        self.next = min(5.0, limit / 2)
        self.run_dir, self.seen, self.snap, self.since, self.polled, self.said = None, None, {}, 0.0, -1.0, None

    def watch(self, run_dir):
        self.run_dir = run_dir

    def __call__(self, seconds):
        if self.run_dir and seconds - self.polled >= 0.5:  # how long the records have been still
            self.polled, snap = seconds, self._read()
            writes = {r: head["writes"] for r, (head, _) in snap.items()}
            if writes != self.seen:
                self.seen, self.since, self.snap = writes, seconds, snap
        if seconds >= self.next:
            doing = self.doing(seconds)
            same = re.sub(r"\d+ s", "", doing) == re.sub(r"\d+ s", "", self.said or "")  # said once
            self.say(f"  … {self.what}: still running after {seconds:.0f} s of {self.limit:g}"
                     + (", as above" if same else doing))
            self.said, self.next = doing, 2 * seconds

    def _read(self):
        try:
            return flightwatch.read(self.run_dir)
        except OSError:  # the run folder is gone: the run just ended
            return {}

    def doing(self, seconds):
        """', every rank waits in all_reduce #6 (...) ...: a deadlock? Ctrl-C ends it', or what else."""
        if not self.run_dir or not self.np:
            return " (Ctrl-C ends it)"
        snap = self.snap
        started = [r for r, (_, entries) in snap.items() if entries]
        if len(snap) < self.np or len(started) < self.np:
            return (f": starting up (imports, joining the world): {len(started)} of {self.np} ranks have made "
                    "a call")
        still = seconds - self.since
        if still < self.STILL_S:
            return ": the ranks are working (their flight records move)"
        places = by_message({r: " ".join(where(entries, set(), r).split()) for r, (_, entries) in snap.items()})
        calls = "; ".join(f"{ranks_of(ranks)} " + ("wait" + place[5:] if len(ranks) > 1 and place.startswith("waits ")
                                                    else place) for ranks, place in places)
        ask = "a deadlock? " if stuck(snap, self.np) else ""  # asked only when every rank is inside a call
        return f", nothing moving for {still:.0f} s: {calls} ({ask}Ctrl-C ends it)"
