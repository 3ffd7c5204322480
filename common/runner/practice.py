"""Practice: the learner's copy of a lesson (practice/, git-ignored), hints, the answer; the progress
file behind them is common/runner/progress.py's."""
import glob
import os
import re

from common.runner import catalog, output_files, practice_grading, yaml_checks
from common.runner.catalog import ROOT
from common.runner.exercise import MARK, PracticeError, find_regions, make_stub
from common.runner.progress import change, load_progress, progress_path, update
from common.text import fit, path_shown


def practice_dir():
    return os.environ.get("TUTOR_PRACTICE") or os.path.join(ROOT, "practice")


def copy_path(lesson):
    return os.path.join(practice_dir(), lesson.name + ".py")


def write_copy(lesson, force=False):
    """Write practice/NN_name.py from the lesson; never over the learner's work unless `force`.
    Returns (path, regions, backup path or None)."""
    with open(lesson.path) as f:
        text = f.read()
    regions = find_regions(text, path_shown(lesson.path))
    if not regions:
        raise PracticeError(f"{lesson.name} has no exercise yet (no `# >>> exercise:` markers)")
    path, backup = copy_path(lesson), None
    stub = make_stub(text, lesson.id, os.path.relpath(lesson.path))
    require_writable(os.path.dirname(path), "TUTOR_PRACTICE")
    require_writable(os.path.dirname(progress_path()), "TUTOR_STATE")
    untouched = False
    if os.path.exists(path):
        if not force:
            raise PracticeError(f"{path_shown(path)} exists (your work): edit it, or start over with "
                                f"`bin/tutor practice {lesson.id} --force`")
        with open(path) as f:
            untouched = f.read() == stub
    try:  # the new copy is written first, then the old one kept aside: a full disk changes nothing
        backup = output_files.replace_keeping(path, stub, keep=os.path.exists(path) and not untouched)
    except output_files.FileError as exc:
        raise PracticeError(str(exc)) from None
    update(lesson, state="in progress")
    return path, regions, backup


def require_writable(folder, variable):
    """PracticeError (one line, before anything is done) when `folder` cannot take files, naming it
    and the way out: the variable that puts that folder elsewhere."""
    if not output_files.writable(folder):
        raise PracticeError(f"{path_shown(folder)} is not writable: set {variable} to a folder of yours")


def state(lesson):
    """'passed', 'in progress' or 'not started' ('' when the lesson has no exercise)."""
    saved = load_progress().get(lesson.name, {}).get("state")
    if saved == "passed":
        return saved
    if saved or os.path.exists(copy_path(lesson)):
        return "in progress"
    with open(lesson.path) as f:
        return "not started" if any(MARK.match(line) for line in f) else ""


def next_hint(lesson):
    """(hints shown so far, total): each call reveals one more, up to all of them. After a failed
    `check --mine` (remember_failure) the hints closest to what failed come first, and a new failure
    starts the count again."""
    hints = lesson.meta.get("hint") or []
    hints = [hints] if isinstance(hints, str) else list(hints)
    if not hints:
        return [], 0
    require_writable(os.path.dirname(progress_path()), "TUTOR_STATE")
    failed = last_failure(lesson)
    order = closest_first(hints, " ".join(failed["what"])) if failed else list(range(len(hints)))

    def one_more(entry):
        seen = entry.get("hints", 0)
        if failed and entry.get("hints_for") != failed:
            seen, entry["hints_for"] = 0, failed
        entry["hints"] = min((seen if isinstance(seen, int) else 0) + 1, len(hints))
    shown = change(lesson, one_more)["hints"]
    return [hints[i].rstrip() for i in order[:shown]], len(hints)


WORD = re.compile(r"[a-z0-9][a-z0-9+\-]*")
COMMON = {"the", "and", "for", "its", "every", "each", "one", "from", "with", "not", "that", "this",
          "what", "when", "get", "got", "want", "your", "you", "all", "but", "are", "has", "have"}


def words(text):
    """The words that carry a sentence's meaning, plural or not ('chunks' is 'chunk')."""
    return {w.removesuffix("s") for w in WORD.findall(text.lower()) if len(w) > 2 and w not in COMMON}


def closest_first(hints, failure):
    """Hint indices, those sharing most words with what failed first (ties keep the YAML's order)."""
    said = words(failure)
    return sorted(range(len(hints)), key=lambda i: -len(words(hints[i]) & said))


def last_failure(lesson):
    """What the last `check --mine` of the lesson failed ({"where", "what"}), or None (passed, not run)."""
    failed = load_progress().get(lesson.name, {}).get("failed")
    ok = isinstance(failed, dict) and isinstance(failed.get("where"), str) and isinstance(failed.get("what"), list)
    return failed if ok else None


def remember_failure(lesson, cases):
    """After `check --mine`: keep what its first failed run of `lesson` failed (the checks' names, or
    the lines that say why it crashed or timed out), for `hint`; a check that passed them all forgets it.
    cases: check_command.run's (lesson, np, api, outcome, verdict, why)."""
    mine = [c for c in cases if c[0] is lesson and c[4] in ("pass", "fail", "crash", "timeout", "usage")]
    bad = next((c for c in mine if c[4] != "pass"), None)
    if not mine:
        return
    if bad is None:
        return change(lesson, lambda entry: entry.pop("failed", None))
    _, n, api, outcome, verdict, why = bad
    checks = yaml_checks.run_checks(lesson.meta["expect"], outcome.results) if outcome and outcome.results else []
    what = [c["name"] for c in checks if not c["ok"]] or [verdict] + list(why)[:3]
    change(lesson, lambda entry: entry.update(failed={"where": f"np={n} api={api}", "what": what}))


def solution(lesson, force=False):
    """The reference regions, as text, once the learner has passed (or with force)."""
    if not force and state(lesson) != "passed":
        raise PracticeError(f"solve it first (`bin/tutor check {lesson.id} --mine`), or peek with "
                            f"`bin/tutor solution {lesson.id} --force`")
    with open(lesson.path) as f:
        text = f.read()
    lines = text.splitlines()
    parts = []
    for r in find_regions(text, path_shown(lesson.path)):
        parts.append(f"# exercise {r.name}: {path_shown(lesson.path)}:{r.begin + 1}-{r.end - 1}")
        parts += r.body(lines) + [""]
    if not parts:
        raise PracticeError(f"{lesson.name} has no exercise yet")
    return "\n".join(parts)


STATE_MARK = {"passed": "✓ passed", "in progress": "in progress", "not started": "not started", "": ""}


def run_mark(lesson):
    """How your last `bin/tutor run` of the lesson ended: '✓', '✗ fail' (its status), '' if never run."""
    last = load_progress().get(lesson.name, {}).get("run")
    return "" if not isinstance(last, str) else "✓" if last == "pass" else f"✗ {last}"


def mine_or_fail(lesson):
    """The learner's copy of `lesson`, or PracticeError saying how to make one."""
    path = copy_path(lesson)
    if not os.path.exists(path):
        kept = [p for p in glob.glob(glob.escape(path) + ".bak*") if re.fullmatch(r"\.bak\d*", p[len(path):])]
        kept.sort(key=os.path.getmtime)  # the newest last
        if kept:
            raise PracticeError(f"no practice copy of {lesson.name}, but your earlier one is kept as "
                                f"{path_shown(kept[-1])}: `mv {path_shown(kept[-1])} {path_shown(path)}` brings "
                                f"it back (or `bin/tutor practice {lesson.id}` starts afresh)")
        raise PracticeError(f"no practice copy of {lesson.name} yet: run `bin/tutor practice {lesson.id}`")
    return path


def welcome(lesson, path, regions, backup):
    lines = [f"wrote {path_shown(path)}" + (f" (your old copy is {path_shown(backup)})"
                                                 if backup else "")]
    with open(path) as f:
        mine = {r.name: r for r in find_regions(f.read())}
    for r in regions:
        m = mine[r.name]
        lines.append(f"  exercise {r.name}: {path_shown(path)}:{m.begin + 1} (between the markers)")
    where = ", ".join(f"{r.begin + 1}-{r.end - 1}" for r in regions)
    lines += [fit(f"read now: the rest of your copy (the page, less the answers); read "
                  f"{path_shown(lesson.path)}:{where} only after you try: those lines are the answers"),
              f"next: edit it, then `bin/tutor check {lesson.id} --mine`; stuck? `bin/tutor hint {lesson.id}`"]
    return "\n".join(lines)


def splice_mine(lesson):
    """How `check --mine` runs the learner's copy (common/runner/practice_grading.py); PracticeError when no
    exercise has been written yet, so nothing is launched."""
    path = mine_or_fail(lesson)
    with open(lesson.path) as f:
        reference = f.read()
    with open(path) as f:
        mine = f.read()
    return practice_grading.splice(reference, mine, path, lesson.path, lesson.id)


def graded_verdict(splice, outcome, verdict, why):
    """(verdict, why) of one --mine run, said for what it graded: a run that passed without reaching
    any region the learner wrote graded nothing of theirs ('not graded')."""
    names = " and ".join(splice.mine)
    ran = practice_grading.reached(outcome, splice)
    if not ran:
        if verdict == "pass":
            return "not graded", [f"this run never reached your {names}, so its pass says nothing "
                                  "about your code"]
        return verdict, why + [f"(this run never reached your {names})"]
    if verdict != "pass" and len(splice.mine) > 1:
        why = why + [f"your code that ran: {', '.join(ran)}"]
    return verdict, why


def record(lesson, verdicts, splice, full):
    """Save the outcome of `check --mine` (one verdict per run); return what the learner reads next."""
    graded = [v for v in verdicts if v in ("pass", "fail", "crash", "timeout", "usage")]
    passed = bool(graded) and all(v == "pass" for v in graded) and "not run" not in verdicts
    shown = path_shown(copy_path(lesson))
    if passed and full and not splice.reference:
        update(lesson, state="passed")
        return (f"✓ {lesson.name}: your code passes every check. `bin/tutor solution {lesson.id}` shows "
                "the reference to compare with.")

    def at_least_in_progress(entry):  # a pass at one NP/API never undoes an earlier full pass
        if entry.get("state") != "passed":
            entry["state"] = "in progress"
    change(lesson, at_least_in_progress)
    if not graded and "not graded" in verdicts:
        return (f"– {lesson.name}: no run reached your {' and '.join(splice.mine)}, so nothing was graded; "
                f"run `bin/tutor check {lesson.id} --mine` without --api / -n to try every path")
    if passed and splice.reference:
        return (f"{lesson.name}: your {' and '.join(splice.mine)} passes every run that reached it; next, "
                f"write exercise {splice.reference[0]} in {shown} (the reference ran in its place)")
    if passed:
        return (f"{lesson.name}: passed this NP/API; `bin/tutor check {lesson.id} --mine` runs them all "
                "and marks it passed")
    return f"✗ {lesson.name}: not yet. Edit {shown}; `bin/tutor hint {lesson.id}` helps"


def running_mine(lesson, script, splice):
    """What `run --mine` says before it launches: which file runs, and where the reference stands in."""
    return [f"your copy {path_shown(script)}, run as `bin/tutor check {lesson.id} --mine` runs it"] + [
        f"note: {line}" for line in splice.notes()]


def after_run(lesson, verdict, np, api, device, mine, lesson_args):
    """What `bin/tutor run` says after its verdict: after a pass, the lesson's takeaway; after a failed
    or crashed run, the command that shows it in the lesson's own view (unless this run was that view).
    A run of the lesson itself is noted for `bin/tutor list`."""
    if not mine:
        try:
            update(lesson, run=verdict)
        except (OSError, output_files.FileError):  # a read-only .tutor/: the list will not know, nothing else
            pass
    if verdict == "pass":
        return catalog.takeaway_lines(lesson)
    command, says = catalog.view_command(lesson, np, api, device, mine)
    if verdict not in ("fail", "crash") or not says or set(lesson.meta["view"]["args"]) <= set(lesson_args):
        return []
    return [f"to see it: {command}", f"  ({says})"]


def see_failures(cases, devices, mine):
    """After `check`: for each lesson whose run failed, the command that shows its first failed run
    (the lesson's own view where its YAML names one, else the run's whole output)."""
    said, lines = set(), []
    for lesson, n, api, outcome, verdict, why in cases:
        if verdict not in ("fail", "crash") or lesson.name in said:
            continue
        said.add(lesson.name)
        command, says = catalog.view_command(lesson, n, api, devices.get(lesson.name, "cpu"), mine)
        lines += [f"to see it: {command}", f"  ({says or 'the whole output, which check does not show'})"]
    return lines
