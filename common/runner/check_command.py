"""`bin/tutor check`: which runs to make (plan_runs), making them one by one (run_all) under a progress
bar drawn only where the terminal can draw it (progress_bar), and what is said after (failures grouped,
the counts, the exit code). bin/tutor only prints what these return, and exits."""
import contextlib
import os
import shutil
import sys
from dataclasses import dataclass, field

from common.runner import exercise, lesson_run, practice, preflight, progress, verdict
from common.text import WIDTH, fit

MARKS = {"pass": "✓", "fail": "✗ fail", "crash": "✗ crash", "timeout": "✗ timeout", "usage": "✗ usage",
         "not graded": "– not graded", "blocked": "– blocked", "not run": "– not run"}
FAILED = ("fail", "crash", "timeout", "usage")


class Interrupted(Exception):
    """The learner (or a signal) stopped a run: say `lines`, exit with `rc` (128 + the signal)."""
    def __init__(self, lines, rc):
        super().__init__(rc)
        self.lines, self.rc = lines, rc


@dataclass
class CheckPlan:
    runs: list = field(default_factory=list)        # (lesson, np, api, device, why blocked or None)
    graded: dict = field(default_factory=dict)      # --mine: lesson name -> practice_grading.Splice
    scripts: dict = field(default_factory=dict)     # --mine: lesson name -> the learner's copy
    unwritten: list = field(default_factory=list)   # --mine: lessons with no exercise written yet


def plan_runs(lessons, np=None, api=None, device=None, mine=False, force=False, junit=None):
    """Every run to make, each validated before any starts. Raises exercise.PracticeError,
    preflight.UsageError, mpi_launchers.LaunchError or preflight.ScriptError (one line each)."""
    out = CheckPlan(scripts={l.name: practice.mine_or_fail(l) if mine else None for l in lessons})
    if mine and not lessons:
        raise exercise.PracticeError("nothing to check yet: start with `bin/tutor practice ID`")
    if junit is not None:
        preflight.check_junit_target(junit)
    if mine:  # check --mine records progress: said before any run, not in a traceback after them all
        practice.require_writable(os.path.dirname(progress.progress_path()), "TUTOR_STATE")
    for lesson in lessons:
        dev = device or ("gpu" if lesson.needs_gpu else "cpu")
        nps = [preflight.parse_np(np, lesson)] if np else lesson.meta["np"]["check"]
        runs = [(n, a) for n in nps for a in ([api] if api else lesson.meta["apis"])]
        for n, a in runs:
            preflight.check_request(lesson, n, a, dev)
        preflight.check_script(out.scripts[lesson.name] or lesson.path)
        if mine:
            try:
                out.graded[lesson.name] = practice.splice_mine(lesson)
            except exercise.PracticeError as exc:  # nothing written yet: nothing to launch
                out.unwritten.append(str(exc))
                continue
        for n, a in runs:
            try:
                preflight.needs(lesson, n, a, dev, force)
                blocked = None
            except preflight.Blocked as exc:
                blocked = f"blocked: {exc}"
            out.runs.append((lesson, n, a, dev, blocked))
    return out


def run_all(how, runs, say):
    """Make `runs` (how.runs, perhaps behind a progress bar) in order; returns (table rows, cases,
    hung). A case is (lesson, np, api, outcome or None, status, why). Once a lesson hangs, its other
    runs are not started: a deadlock hangs every NP alike. Raises Interrupted, UsageError, LaunchError."""
    rows, cases, hung = [], [], {}
    for lesson, n, a, dev, blocked in runs:
        if blocked or lesson.name in hung:
            status = "blocked" if blocked else "not run"
            rows.append((lesson.name, n, a, "-", "-", MARKS[status]))
            cases.append((lesson, n, a, None, status, [blocked or f"not run: {hung[lesson.name]} hung first"]))
            continue
        waiting = lesson_run.Waiting(f"{lesson.name} np={n} {a}", lesson_run.limit(lesson), say, n)
        outcome, checks = lesson_run.run_lesson(lesson, n, a, dev, lesson.meta.get("args", []), echo=False,
                                            tick=waiting, splice=how.graded.get(lesson.name))
        why = verdict.explain(lesson, outcome, checks)
        if outcome.interrupted:
            raise Interrupted(why, outcome.rc)
        if outcome.timed_out:
            hung[lesson.name] = f"np={n} {a}"
        status = verdict.status(outcome, checks)
        if lesson.name in how.graded:
            why = exercise.explain_for_learner(lesson, outcome, checks, how.scripts[lesson.name], why)
            status, why = practice.graded_verdict(how.graded[lesson.name], outcome, status, why)
        rows.append((lesson.name, n, a, f"{sum(c['ok'] for c in checks or [])}/{len(checks or [])}",
                     f"{outcome.seconds:.1f}", MARKS[status]))
        cases.append((lesson, n, a, outcome, status, why))
    return rows, cases, hung


def problems(cases):
    """(mark, heading, why lines) for every run that did not pass: failures first, then the rest;
    runs that said the same thing are one heading."""
    said = [(f"{lesson.name} np={n} api={a}", why, status) for lesson, n, a, outcome, status, why in cases
            if status not in ("pass", "not run")]
    for kind in ("✗", "–"):
        these = [(head, why) for head, why, status in said if MARKS[status].startswith(kind)]
        for head, why in exercise.grouped(these):
            yield kind, head, why


def recorded(how, lessons, cases, full):
    """--mine: what each graded lesson's progress now says (practice.record)."""
    return [practice.record(lesson, [c[4] for c in cases if c[0] is lesson], how.graded[lesson.name], full=full)
            for lesson in lessons if lesson.name in how.graded]


def tally(how, cases):
    """The closing line ('3 passed, 1 failed, 2 blocked') and the exit status: failed or not run 1,
    otherwise blocked 4, else 0."""
    count = {v: sum(c[4] == v for c in cases) for v in MARKS}
    failed = sum(count[v] for v in FAILED)
    line = ", ".join([f"{count['pass']} passed", f"{failed} failed"] +
                     [f"{count[v]} {v}" for v in ("not graded", "blocked", "not run") if count[v]])
    rc = (verdict.EXIT["fail"] if failed or count["not run"] or how.unwritten else
          verdict.EXIT["blocked"] if count["blocked"] else 0)
    return line, rc


def plain_terminal(stream):
    """True where a progress bar cannot be drawn: TERM=dumb (no cursor control), or fewer than 60
    columns (COLUMNS or the terminal's own); False for a file or pipe, where nothing is drawn anyway."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return False
    return os.environ.get("TERM") == "dumb" or shutil.get_terminal_size((WIDTH, 24)).columns < 60


def progress_bar(items, label, show, stream=None):
    """A `with` block over `items`: on a terminal that draws, click's bar sized to fit min(its columns,
    WIDTH); on a dumb or narrow one, one plain line per item ('checking 2/8: 05 np=2 mpi4py')."""
    import typer
    stream = stream or sys.stdout
    items = list(items)
    if plain_terminal(stream):
        def lines():
            for i, item in enumerate(items, 1):
                print(fit(f"{label} {i}/{len(items)}: {show(item)}", shutil.get_terminal_size((WIDTH, 24)).columns),
                      file=stream, flush=True)
                yield item
        return contextlib.nullcontext(lines())
    cols = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    clutter = len(label) + 2 * len(str(len(items))) + max([len(show(i)) for i in items] + [0]) + 12
    return typer.progressbar(items, label=label, show_pos=True, width=max(4, min(36, cols - 1 - clutter)),
                             item_show_func=lambda p: p and show(p), file=stream)
