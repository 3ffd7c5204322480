"""The runner's side of the flight recorder: reading the ranks' records (rankR.flight, common/flight.py)
while a run goes and once it ended, ending a planted hang early, and the words under the verdict.

A lesson that breaks on purpose (lesson 14) writes planted.json in the run folder: {"np", "stuck_s",
"params"}. The runner then ends the run once every rank has waited inside a call for stuck_s seconds
with no record moving, and grades common/runner/diagnose.py's diagnosis against the params.
`bin/tutor why` shows the last run's diagnosis again (.tutor/last-why.json).
"""
import json
import os
import re
import stat
import types

from common import flight
from common.plumbing import run_folder
from common.runner import rank_processes
from common.runner.diagnose import diagnose, stuck

STARVED = 0.1  # s of CPU: a busy-waiting rank that had this long and saw no message is waiting on a peer


def read(run_dir):
    snap = {}
    for rank, path in run_folder.rank_files(run_dir, "flight").items():
        try:
            with open(path, "rb") as f:
                head, entries = flight.parse(f.read())
        except OSError:
            continue
        if head:
            snap[rank] = (head, entries)
    return snap


def planted(run_dir):
    """What a lesson that breaks on purpose says it broke (planted.json), or None."""
    try:
        with open(run_folder.planted(run_dir)) as f:
            plan = json.load(f)
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("np"), int) else None


def moved(before, after):
    """Ranks whose record was written between two reads."""
    return {r for r in after if r not in before or after[r][0]["writes"] != before[r][0]["writes"]}


class Watch:
    """The runner's eye on a run's records: ends a run that planted a fault once every rank has waited
    in a call, nothing moving, for its stuck_s (poll); diagnoses every run it watched (finish)."""

    def __init__(self, run_dir, cpu=rank_processes.cpu_and_state):
        self.run_dir, self.fault, self.last, self.since, self.early = run_dir, None, None, None, None
        self.first = None  # the records when the run was about to be ended (before)
        self.cpu, self.cpu_since = cpu, {}

    def poll(self, seconds):
        """True when the run should be ended now: stuck as a planted fault makes it. A rank that is
        runnable but got under STARVED s of CPU since the records stopped may be waiting for a core
        (more ranks than cores, a busy machine), not for a peer: the run goes on until it had it."""
        if self.fault is None:
            self.fault = planted(self.run_dir) or None
        if not self.fault or not self.fault.get("stuck_s"):
            return False
        snap = read(self.run_dir)
        sig = {r: h["writes"] for r, (h, _) in snap.items()}
        still = stuck(snap, self.fault["np"])
        if not still or sig != self.last:
            self.last, self.since = sig, seconds
            self.cpu_since = self.cpu(self.run_dir) if still else {}
            return False
        if seconds - self.since < self.fault["stuck_s"]:
            return False
        now = self.cpu(self.run_dir)
        if any(state == "R" and used - self.cpu_since.get(r, (used,))[0] < STARVED
               for r, (used, state) in now.items()):
            return False
        self.early = seconds - self.since
        return True

    def before(self):
        self.first = read(self.run_dir)

    def finish(self, out, np):
        """Set out.diagnosis (and out.planted) from the records of any run that was not interrupted."""
        out.planted = self.fault or planted(self.run_dir)
        out.stuck = self.early
        if out.interrupted:  # every other run is read: one that passed must show no divergence (a
            return           # fault MPI let pass still shows in the records)
        snap = read(self.run_dir)
        moving = moved(self.first, snap) if out.timed_out and self.first is not None else set()
        found = diagnose(snap, np or len(snap), moving)
        if found and not out.timed_out and found.get("outside") and found.get("rank") in out.errors:
            found = None  # a rank that failed between calls: its error names it, no call diverged
        out.diagnosis = found


def lines(outcome):
    """The diagnosis under the verdict: a heading and its lines, indented; [] without one."""
    d = getattr(outcome, "diagnosis", None)
    return ["why, from the ranks' flight records:"] + [f"  {line}" for line in d["lines"]] if d else []


def opening(lesson, outcome):
    """The first line of a hung run's report: past its limit, or ended early once nothing moved."""
    if outcome.stuck is not None:
        return (f"STUCK: {lesson.name}: every rank waited {outcome.stuck:.0f} s in a call, nothing moving; "
                "all ended. Where each was:")
    return f"TIMEOUT: {lesson.name} ran past its {outcome.limit:g} s limit; every rank was ended. Where each rank was:"


def last_path(lesson_name=None):
    """last-why.json (the last run of any lesson), or why-NN_topic.json (the last run of that lesson)."""
    from common.runner.progress import progress_path
    return os.path.join(os.path.dirname(progress_path()),
                        f"why-{lesson_name}.json" if lesson_name else "last-why.json")


def errors_path():
    """Where the error output a planted fault's run held back is kept (beside last-why.json)."""
    return os.path.join(os.path.dirname(last_path()), "last-errors.txt")


def _sentence(error, limit=200):
    """An error to its first sentence: gloo's [/its/source.cc:537] and its advice say little."""
    error = " ".join(re.sub(r"\[/[^\]]*\]\s*", "", error).split())
    sentence = re.match(r"(.{40,}?[.!?])\s", error)
    error = sentence[1] + " …" if sentence else error
    return error if len(error) <= limit else error[:limit - 1] + "…"


def ending(outcome):
    """How a planted fault's run ended, after the diagnosis: each rank's error to its first sentence
    (ranks that said the same, once), and how many lines of error output the run held back (MPI's
    error stack, tracebacks, the launcher's report), kept in errors_path(); [] when there is neither."""
    from common.text import by_message, path_shown, ranks_of
    held = getattr(outcome, "held", None) or {}
    count = sum(len(text.splitlines()) if isinstance(text, str) else len(text) for text in held.values())
    said = [f"{ranks_of(ranks)}: {error}" for ranks, error in
            by_message({r: _sentence(e) for r, e in outcome.errors.items()})]
    if not said and outcome.rc and not outcome.timed_out:
        said = [f"status {outcome.rc}"]
    kept = [f"({count} lines of error output kept: {path_shown(errors_path())})"] if count else []
    if len(said) == 1:
        return [f"how it ended: {said[0]}" + (f" {kept[0]}" if kept else "")]
    return (["how it ended:"] + [f"  {line}" for line in said + kept]) if said else \
        [f"{count} lines of error output kept: {path_shown(errors_path())}"] if count else []


def planted_lines(lesson, outcome, checks, short):
    """Why a planted fault's run (lesson 14) ended as it did: the checks that failed, what the records
    say, then how the run ended in one line (its raw error output is kept, not shown)."""
    said = [f"check failed: {c['name']}: got {short(c['got'])}, want {short(c['want'])}"
            for c in checks or [] if not c["ok"]]
    said += lines(outcome) or ["why: the ranks' flight records show no divergence"]
    if outcome.timed_out:
        said.append(opening(lesson, outcome).split(" Where each")[0])
    return said + ending(outcome)


_KEPT = {}  # lesson name -> the verdicts this process remembered: a check's failed run stays what `why` shows


def remember(head, verdict, outcome):
    """Keep the last run's diagnosis for `bin/tutor why` (and for `why ID`, the lesson's last run), and
    the error output it held back (nothing is lost if they cannot be written). Of a command's several
    runs (a check), the last that did not pass. head starts with the lesson's name."""
    from common.report import atomic_write
    name = head.split()[0]
    failed = [v != "pass" for v in _KEPT.get(name, [])]
    if verdict == "pass" and any(failed):
        return
    last = not (verdict == "pass" and any(v != "pass" for vs in _KEPT.values() for v in vs))
    _KEPT.setdefault(name, []).append(verdict)
    held = getattr(outcome, "held", None) or {}
    record = json.dumps({"run": head, "status": verdict, "diagnosis": outcome.diagnosis}) + "\n"
    try:
        os.makedirs(os.path.dirname(last_path()), exist_ok=True)
        atomic_write(last_path(name), record)
        if not last:  # another lesson of this check failed: `why` alone keeps telling of that one
            return
        atomic_write(last_path(), record)
        if held:
            atomic_write(errors_path(), "".join(f"== {who} ({head})\n" + (text if isinstance(text, str) else
                                                                          "\n".join(text) + "\n")
                                                for who, text in held.items()))
        elif os.path.lexists(errors_path()):
            os.unlink(errors_path())
    except OSError:
        pass


def _read_last(path):
    """The record's object (last-why.json or a lesson's); None when there is none; a ValueError saying
    why it cannot be read (not a plain file, too large, not JSON). Opened without blocking: a FIFO
    there must not hang `why`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(exc.strerror) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a plain file")
        if st.st_size > 1 << 20:
            raise ValueError(f"{st.st_size} bytes, more than a record holds")
        data = os.read(fd, 1 << 20)
    except OSError as exc:
        raise ValueError(exc.strerror) from None
    finally:
        os.close(fd)
    try:
        return json.loads(data.decode())
    except ValueError as exc:
        raise ValueError(f"not JSON: {type(exc).__name__}") from None


def recall(lesson=None):
    """The lines `bin/tutor why [ID]` prints, and its exit status (1 when there is nothing to show, or
    the record cannot be read: one line says so). With a lesson: that lesson's last run."""
    from common.text import path_shown
    path = last_path(lesson.name if lesson else None)
    try:
        last = _read_last(path)
    except ValueError as exc:
        return [f"tutor: the last run's record cannot be read ({exc}); remove {path_shown(path)}"], 1
    if last is None:
        return ([f"no run of {lesson.name} recorded yet: `bin/tutor run {lesson.id}` first"] if lesson else
                ["no run recorded yet: `bin/tutor run ID` first"]), 1
    d = last.get("diagnosis") if isinstance(last, dict) else None
    if not (isinstance(last, dict) and isinstance(last.get("run"), str) and isinstance(last.get("status"), str)
            and (d is None or isinstance(d, dict) and isinstance(d.get("lines", []), list)
                 and all(isinstance(line, str) for line in d.get("lines", [])))):
        return [f"tutor: the last run's record is not one the tutor wrote; remove {path_shown(path)}"], 1
    if not d or not d.get("lines"):
        return [f"the last run ({last['run']}: {last['status']}) left nothing to diagnose"], 1
    kept = [f"(its error output is kept in {path_shown(errors_path())})"] \
        if os.path.isfile(errors_path()) and not lesson else []
    return [f"the last run: {last['run']}: {last['status']}"] + lines(types.SimpleNamespace(diagnosis=d)) + kept, 0
