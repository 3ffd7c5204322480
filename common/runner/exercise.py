"""Exercise regions in a lesson's source, the stub made from them, and what a learner is told.

A lesson marks the heart of its idea, inside a function body, with two lines at one indentation:
    # >>> exercise: short_name
    ...reference code...
    # <<< exercise: short_name
The lesson file stays the only copy of the answer. `make_stub` keeps the markers and replaces what is
between them with a TODO and a `raise NotImplementedError`, so an unfinished exercise fails loudly.
Pure functions on text and run outcomes; the files and progress are common/runner/practice.py's.
"""
import re
from dataclasses import dataclass

from common.text import path_shown, short

MARK = re.compile(r"^(?P<indent>[ \t]*)# (?P<end>>>>|<<<) exercise: (?P<name>[A-Za-z0-9_]+)\s*$")
UNDONE = re.compile(r"NotImplementedError: exercise (?P<name>[A-Za-z0-9_]+)\b.*?(?:\((?P<at>[^()]+:\d+)\))?$")


class PracticeError(ValueError):
    """One line for the learner, exit status 2."""


@dataclass
class Region:
    name: str
    begin: int   # 1-based line of the `# >>>` marker
    end: int     # 1-based line of the `# <<<` marker
    indent: str

    def body(self, lines):
        return lines[self.begin:self.end - 1]


def find_regions(text, where="lesson"):
    """Every exercise region of a source text, in order; PracticeError on a malformed marker pair."""
    regions, open_ = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = MARK.match(line)
        if not m:
            continue
        name, indent = m["name"], m["indent"]
        if m["end"] == ">>>":
            if open_:
                raise PracticeError(f"{where}:{number}: exercise {name!r} starts inside {open_.name!r}")
            if any(r.name == name for r in regions):
                raise PracticeError(f"{where}:{number}: exercise {name!r} is marked twice")
            open_ = Region(name, number, 0, indent)
        elif not open_ or open_.name != name or open_.indent != indent:
            raise PracticeError(f"{where}:{number}: `<<< exercise: {name}` does not close an open region "
                                "at the same indentation")
        else:
            open_.end = number
            if open_.end == open_.begin + 1:
                raise PracticeError(f"{where}:{number}: exercise {name!r} has no code between its markers")
            regions.append(open_)
            open_ = None
    if open_:
        raise PracticeError(f"{where}:{open_.begin}: exercise {open_.name!r} is never closed")
    return regions


def stub_body(r, lesson_id="NN"):
    """The lines a region's body becomes in the learner's copy: a TODO and a loud failure."""
    return [f"{r.indent}# TODO: write this part. `bin/tutor hint {lesson_id}` gives a hint; "
            f"`bin/tutor check {lesson_id} --mine` checks it.\n",
            f'{r.indent}raise NotImplementedError("exercise {r.name}: not done yet")\n']


def make_stub(text, lesson_id="NN", where="lesson", only=None):
    """The learner's version of a lesson: each region's body (or only the one named) becomes a TODO
    and a loud failure."""
    lines = text.splitlines(keepends=True)
    for r in reversed([r for r in find_regions(text, where) if only in (None, r.name)]):
        lines[r.begin:r.end - 1] = stub_body(r, lesson_id)
    return "".join(lines)


def unfinished(outcome, script):
    """Plain lines naming each exercise a run died in because it is still a stub."""
    found = {}
    for text in [*outcome.errors.values(), *outcome.tail]:
        m = UNDONE.search(text.strip())
        if m and m["name"] not in found:
            found[m["name"]] = m["at"]
    try:
        with open(script) as f:
            regions = {r.name: r for r in find_regions(f.read(), path_shown(script))}
    except (OSError, PracticeError):
        regions = {}
    lines = []
    for name, at in found.items():
        r = regions.get(name)
        where = f"{path_shown(script)}:{r.begin + 1}-{r.end - 1}" if r else at or path_shown(script)
        lines.append(f"exercise {name!r} is not done yet: replace the TODO and the `raise "
                     f"NotImplementedError` at {where} with your code")
    return lines


def explain_for_learner(lesson, outcome, checks, script, lines):
    """runner.explain's lines, said for a learner: unfinished exercises first, checks in words."""
    said = unfinished(outcome, script)
    if said and checks is None:
        return said  # the stub stopped the run; nothing else is worth reading yet
    paths = {c["name"]: c["value"] for c in lesson.meta["expect"]}
    for line in lines:
        if said and UNDONE.search(line):
            continue  # already said as "exercise ... is not done yet"
        if line.startswith("check failed: "):
            continue  # said below, with what was expected
        said.append(line)
    for c in checks or []:
        if not c["ok"]:
            got = short(c["got"], 160, sep="; ")
            want = c.get("rule") or short(c["want"], 60)  # the YAML's formula, not its values at every item
            said.append(f"check failed: \"{c['name']}\": wanted {paths.get(c['name'], 'the value')} "
                        f"{want}, but got {got}")
    return said


def grouped(failures):
    """[(head, why)] with runs that failed for the same reasons merged into one head."""
    merged = {}
    for head, why in failures:
        merged.setdefault(tuple(why), []).append(head)
    return [(heads[0] if len(heads) == 1 else heads[0].split(" np=")[0] + ": " +
             ", ".join(h.split(" ", 1)[1] for h in heads), list(why)) for why, heads in merged.items()]
