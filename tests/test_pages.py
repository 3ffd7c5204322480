"""The page is the lesson (GUIDE §3): every lesson page reads in one sitting, its idea on the first screen.

Each `lessons/NN_topic.py` holds: a docstring of at most 30 lines, at most ~450 lines in all, its first
exercise region within the first ~120 lines, a `main()` of at most ~40 lines that reads as an outline,
and the other lessons it builds on named at the top (never loaded inside a function). A lesson's own
modules sit in `lessons/<topic>/`, named after it; nothing else is under lessons/. No lesson is exempt.
"""
import ast
import os
import re

import pytest

from common.runner import exercise
from conftest import ROOT

LESSONS = os.path.join(ROOT, "lessons")
PAGE = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")
MAX_LINES, MAX_DOC, FIRST_EXERCISE, MAX_MAIN = 450, 30, 120, 40
PAGES = sorted(f for f in os.listdir(LESSONS) if PAGE.match(f))


def measure(path):
    """{lines, docstring, first_exercise, main} of one page: what the page rule holds."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    doc = tree.body[0]
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), f"{path}: no docstring"
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    regions = exercise.find_regions(source, path)
    return {"lines": len(source.splitlines()), "docstring": doc.end_lineno - doc.lineno + 1,
            "first_exercise": min((r.begin for r in regions), default=None),
            "main": main[0].end_lineno - main[0].lineno + 1 if main else None, "tree": tree}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_reads_in_one_sitting(page):
    m = measure(os.path.join(LESSONS, page))
    said = (f"{page}: {m['lines']} lines, docstring {m['docstring']}, first exercise at line "
            f"{m['first_exercise']}, main() {m['main']} lines")
    assert m["lines"] <= MAX_LINES, f"{said}: over {MAX_LINES} lines (move what is not the idea to lessons/<topic>/)"
    assert m["docstring"] <= MAX_DOC, f"{said}: docstring over {MAX_DOC} lines"
    assert m["first_exercise"] is not None, f"{said}: no exercise region"
    assert m["first_exercise"] <= FIRST_EXERCISE, f"{said}: the first exercise starts after line {FIRST_EXERCISE}"
    assert m["main"] is not None and m["main"] <= MAX_MAIN, f"{said}: main() is not an outline of <= {MAX_MAIN} lines"


@pytest.mark.parametrize("page", PAGES)
def test_the_lessons_a_page_builds_on_are_named_at_its_top(page):
    """bootstrap.lesson_module("05") at module level, where a reader sees it, never inside a function."""
    tree = measure(os.path.join(LESSONS, page))["tree"]
    hidden = [f"line {node.lineno} in {fn.name}()" for fn in ast.walk(tree)
              if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              for node in ast.walk(fn) if isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "lesson_module"]
    assert not hidden, f"{page} loads another lesson inside a function: {', '.join(hidden)}"


def test_every_module_under_lessons_belongs_to_one_lesson():
    """Pages and their YAML at the top; a lesson's own modules in the folder named for its topic."""
    topics = {PAGE.match(p).group(2) for p in PAGES}
    stray = []
    for dirpath, dirnames, filenames in os.walk(LESSONS):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, LESSONS)
        for name in filenames:
            if rel == ".":
                ok = PAGE.match(name) or (name.endswith(".yaml") and name[:-5] + ".py" in PAGES)
            else:
                ok = rel in topics and name.endswith(".py")
            if not ok:
                stray.append(os.path.join(rel, name))
        if rel != "." and rel.split(os.sep)[0] not in topics:
            stray.append(rel + "/")
    assert not stray, f"under lessons/ but no lesson's page or folder: {sorted(set(stray))}"


def test_pages_share_one_text_width():
    """One WIDTH and one wrapped() for the kit (common/text.py), not a copy per page."""
    copies = []
    for dirpath, _, filenames in os.walk(LESSONS):
        for name in filenames:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                for node in tree.body:
                    if isinstance(node, ast.FunctionDef) and node.name == "wrapped":
                        copies.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} def wrapped")
                    if isinstance(node, ast.Assign) and any(getattr(t, "id", "").startswith("WIDTH")
                                                            for t in node.targets):
                        copies.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} WIDTH")
    assert not copies, "use common.text's WIDTH and wrapped: " + ", ".join(copies)


def test_the_rule_can_fail(tmp_path):
    """A page that breaks each part of the rule is measured as breaking it."""
    body = ['"""Lesson 99.\n' + "line\n" * 40 + '"""\n'] + ["x = 1\n"] * 200 + [
        "def f():\n", "    # >>> exercise: late\n", "    pass\n", "    # <<< exercise: late\n",
        "def main():\n"] + ["    pass\n"] * 50
    page = tmp_path / "99_bad.py"
    page.write_text("".join(body))
    m = measure(str(page))
    assert m["docstring"] > MAX_DOC and m["first_exercise"] > FIRST_EXERCISE and m["main"] > MAX_MAIN
