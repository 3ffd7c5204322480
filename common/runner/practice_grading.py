"""Grading a practice copy one idea at a time (`bin/tutor check ID --mine`).

Before anything is launched, each exercise region of the learner's copy is compared with the stub
`practice` wrote: a region still the stub is *untouched*, and the lesson's reference runs in its place,
so a run grades only what the learner wrote; a copy with every region untouched is not launched at all.
Each region's opening marker becomes a line that leaves `ran-NAME` in the run folder the first time the
region runs, so the runner measures which of the learner's regions a run reached: a run that reached
none graded nothing of theirs (lesson 01's torch path never calls the MPI exercise) and says so.

The launched text lies in the run folder; its lines differ from the copy's where a reference replaced
a stub, so every file:line the run reports is mapped back to the copy (or to the lesson, for lines of
a reference) before the learner reads it. Pure functions on text; the launch is common/runner/supervise.py's.
"""
import os
import re
from dataclasses import dataclass, field

from common.plumbing import run_folder
from common.runner.catalog import ROOT
from common.runner.exercise import PracticeError, find_regions, stub_body
from common.text import path_shown


def recorder(indent, name):
    """One statement, on the marker's own line, that leaves ran-NAME (run_folder.ran) in the run folder
    once per process; it imports nothing of the kit's."""
    seen, os_ = '__import__("sys").__dict__.setdefault("_tutor_ran", set())', '__import__("os")'
    return (f"{indent}if {name!r} not in {seen}: {seen}.add({name!r}); open({os_}.path.join("
            f'{os_}.environ["{run_folder.ENV}"], "{run_folder.RAN}{name}"), "a").close()  # >>> exercise: {name}\n')


@dataclass
class Splice:
    copy: str                                   # the learner's file, as the learner knows it
    lesson_path: str                            # the lesson: where the reference lines come from
    text: str                                   # what is launched
    mine: list = field(default_factory=list)    # regions the learner wrote
    reference: list = field(default_factory=list)  # regions still the stub: the reference runs
    origin: list = field(default_factory=list)  # launched line i+1 -> (file, line) it stands for

    def notes(self):
        """What the learner is told before the runs: which regions run the reference."""
        if not self.reference:
            return []
        theirs = ", ".join(self.mine)
        return [f"exercise {name}: still the TODO, so the lesson's reference runs in its place; "
                f"graded: your {theirs}" for name in self.reference]


def splice(lesson_text, copy_text, copy_path, lesson_path, lesson_id):
    """The Splice that grades `copy_text` (its regions in the lesson's text); PracticeError (one line)
    when no region was written yet."""
    shown = path_shown(copy_path)
    ref = {r.name: r for r in find_regions(lesson_text, path_shown(lesson_path))}
    ref_lines, lines = lesson_text.splitlines(keepends=True), copy_text.splitlines(keepends=True)
    regions = find_regions(copy_text, shown)
    gone = [name for name in ref if name not in {r.name for r in regions}]
    if ref and len(gone) == len(ref):
        raise PracticeError(
            f"{shown} has no exercise markers left (`# >>> exercise: {gone[0]}` ... `# <<< exercise: "
            f"{gone[0]}`), so nothing of yours can be graded: put them back around your code (see "
            f"{path_shown(lesson_path)}:{ref[gone[0]].begin}), or `bin/tutor practice {lesson_id} --force` "
            "for a fresh copy (yours is kept as .bak)")
    untouched = [r for r in regions if r.name in ref and
                 [x.strip() for x in r.body(lines)] == [x.strip() for x in stub_body(r, lesson_id)]]
    if regions and len(untouched) == len(regions):
        spots = ", ".join(f"{r.name} ({shown}:{r.begin + 1})" for r in regions)
        raise PracticeError(f"nothing to check yet: every exercise is still the TODO ({spots}); "
                            f"write one, then `bin/tutor check {lesson_id} --mine` (no run was started)")
    skip = {r.name for r in untouched}
    out, origin, pos = [], [], 0
    for r in regions:
        for n in range(pos, r.begin - 1):
            out.append(lines[n])
            origin.append((copy_path, n + 1))
        out.append(recorder(r.indent, r.name))
        origin.append((copy_path, r.begin))
        if r.name in skip:  # the reference body, re-indented to the copy's marker
            own = ref[r.name]
            for n in range(own.begin, own.end - 1):
                text = ref_lines[n]
                body = text[len(own.indent):] if text.startswith(own.indent) else text.lstrip(" \t")
                out.append(r.indent + body if text.strip() else text)
                origin.append((lesson_path, n + 1))
        else:
            for n in range(r.begin, r.end - 1):
                out.append(lines[n])
                origin.append((copy_path, n + 1))
        pos = r.end - 1
    for n in range(pos, len(lines)):
        out.append(lines[n])
        origin.append((copy_path, n + 1))
    text = "".join(out)
    try:  # a marker somewhere a statement cannot stand: launch the copy as it is, unmeasured
        compile(text, shown, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        text, origin, skip = copy_text, [(copy_path, n + 1) for n in range(len(lines))], set()
    return Splice(copy_path, lesson_path, text, [r.name for r in regions if r.name not in skip],
                  [r.name for r in regions if r.name in skip], origin)


def relabel(outcome, splice, launched):
    """Rewrite every `launched:LINE` and `File "launched", line LINE` the run reported (errors,
    output, stacks) as the copy's (or the lesson's) own file and line. Changes `outcome` in place."""
    spellings = {launched, os.path.abspath(launched), os.path.relpath(launched),
                 os.path.relpath(launched, ROOT)}
    pattern = re.compile("(" + "|".join(re.escape(s) for s in sorted(spellings, key=len, reverse=True))
                         + r')(:|", line )(\d+)')

    def swap(m):
        n = int(m.group(3))
        path, line = splice.origin[n - 1] if 0 < n <= len(splice.origin) else (splice.copy, n)
        return f"{path_shown(path)}{m.group(2)}{line}"

    def fix(text):
        return pattern.sub(swap, text) if isinstance(text, str) else text
    outcome.errors = {r: fix(e) for r, e in outcome.errors.items()}
    outcome.tail = [fix(t) for t in outcome.tail]
    outcome.stacks = {r: [(fn, fix(at)) for fn, at in frames] for r, frames in outcome.stacks.items()}
    return outcome


def reached(outcome, splice):
    """The learner's regions the run reached, in the copy's order."""
    return [name for name in splice.mine if name in outcome.ran]
