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
import types

from common import flight
from common.runner.diagnose import diagnose, stuck


def read(run_dir):
    snap = {}
    for name in os.listdir(run_dir):
        m = re.match(r"rank(\d+)\.flight$", name)
        if m:
            try:
                with open(os.path.join(run_dir, name), "rb") as f:
                    head, entries = flight.parse(f.read())
            except OSError:
                continue
            if head:
                snap[int(m.group(1))] = (head, entries)
    return snap


def planted(run_dir):
    """What a lesson that breaks on purpose says it broke (planted.json), or None."""
    try:
        with open(os.path.join(run_dir, "planted.json")) as f:
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

    def __init__(self, run_dir):
        self.run_dir, self.plan, self.last, self.since, self.early = run_dir, None, None, None, None
        self.first = None  # the records when the run was about to be ended (before)

    def poll(self, seconds):
        """True when the run should be ended now: stuck as a planted fault makes it."""
        if self.plan is None:
            self.plan = planted(self.run_dir) or None
        if not self.plan or not self.plan.get("stuck_s"):
            return False
        snap = read(self.run_dir)
        sig = {r: h["writes"] for r, (h, _) in snap.items()}
        if not stuck(snap, self.plan["np"]) or sig != self.last:
            self.last, self.since = sig, seconds
            return False
        if seconds - self.since >= self.plan["stuck_s"]:
            self.early = seconds - self.since
            return True
        return False

    def before(self):
        self.first = read(self.run_dir)

    def finish(self, out, np):
        """Set out.diagnosis (and out.planted) from the records of any run that was not interrupted."""
        out.planted = self.plan or planted(self.run_dir)
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


def last_path():
    from common.runner.progress import progress_path
    return os.path.join(os.path.dirname(progress_path()), "last-why.json")


def remember(head, verdict, outcome):
    """Keep the last run's diagnosis for `bin/tutor why` (nothing is lost if it cannot be written)."""
    from common.report import atomic_write
    try:
        os.makedirs(os.path.dirname(last_path()), exist_ok=True)
        atomic_write(last_path(), json.dumps({"run": head, "status": verdict,
                                              "diagnosis": outcome.diagnosis}) + "\n")
    except OSError:
        pass


def recall():
    """The lines `bin/tutor why` prints, and its exit status (1 when there is nothing to show)."""
    try:
        with open(last_path()) as f:
            last = json.load(f)
    except (OSError, ValueError):
        last = None
    if not (isinstance(last, dict) and {"run", "status"} <= set(last)):  # none yet, or not ours
        return ["no run recorded yet: `bin/tutor run ID` first"], 1
    if not isinstance(last.get("diagnosis"), dict) or not last["diagnosis"].get("lines"):
        return [f"the last run ({last['run']}: {last['status']}) left nothing to diagnose"], 1
    return [f"the last run: {last['run']}: {last['status']}"] + lines(
        types.SimpleNamespace(diagnosis=last["diagnosis"])), 0
