"""The house: lessons and the modules they use never import the runner's package (common/runner/), and
no lesson calls the plumbing under every rank (common/plumbing/)."""
import ast
import glob
import os

from conftest import ROOT


def imports(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_arrows_point_one_way_from_the_runner_to_what_lessons_use():
    lesson_side = [*glob.glob(os.path.join(ROOT, "common", "*.py")),
                   *glob.glob(os.path.join(ROOT, "common", "plumbing", "*.py")),
                   *glob.glob(os.path.join(ROOT, "lessons", "**", "*.py"), recursive=True)]
    wrong = [f"{os.path.relpath(p, ROOT)} imports {mod}" for p in lesson_side for mod, names in imports(p)
             if mod.startswith("common.runner") or (mod == "common" and "runner" in names)]
    assert len(lesson_side) > 10 and not wrong, wrong


def test_no_lesson_calls_the_plumbing():
    """common/plumbing/ runs under every rank for the kit; a learner sent into common/ from a page never
    needs it, so no page and no lesson's own module imports it."""
    pages = glob.glob(os.path.join(ROOT, "lessons", "**", "*.py"), recursive=True)
    wrong = [f"{os.path.relpath(p, ROOT)} imports {mod}" for p in pages for mod, names in imports(p)
             if mod.startswith("common.plumbing") or (mod == "common" and "plumbing" in names)]
    assert len(pages) > 17 and not wrong, wrong


def test_the_readme_opens_with_the_way_in_and_keeps_environments_below_it():
    """A new user's first screen (30 lines) goes from setup to a passing practice exercise; the path,
    the glossary and the call map come before setup, CUDA and MPI detail."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    first = "\n".join(readme.splitlines()[:30])
    for step in ("make setup", "bin/tutor run 00", "bin/tutor practice 00", "bin/tutor check 00 --mine"):
        assert step in first, step
    before = readme[:readme.index("## Setup and environments")]
    assert all(word not in before for word in ("CUDA", "driver", "TUTOR_PYTHON", "Open MPI")), before[:200]
    for term in ("rank", "NP", "communicator", "algbw", "busbw", "alpha-beta", "eager and rendezvous",
                 "torch.distributed", "ncclAllReduce", "bin/tutor busbw", "bin/tutor run 05 -n 4 -- --trace"):
        assert f"**{term}**" in before or term in before, term
    ids = [line.split("|")[1].strip() for line in before.splitlines() if line.startswith("| ")]
    assert [i for i in ids if i.isdigit()] == sorted(f for f in {p[:2] for p in os.listdir(
        os.path.join(ROOT, "lessons")) if p[:2].isdigit()}), "the path lists every lesson, in order"


def layout_block():
    """README's Layout section: {folder: the file names its lines (and their continuation lines) name}."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    named, folder = {}, None
    for line in filter(str.strip, block.splitlines()):
        if line[:1].strip():  # a folder's (or file's) own line; continuation lines start with spaces
            folder = line.split()[0]
            named.setdefault(folder, set())
            words = line.split()[1:]
        else:
            words = line.split()
        named[folder] |= {w.strip(",.:;()") for w in words if w.strip(",.:;()").endswith(".py")}
    return named


def test_the_readme_layout_names_every_module_of_common_and_the_runner():
    named = layout_block()
    for folder in ("common/", "common/plumbing/", "common/runner/"):
        there = {f for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".py") and f != "__init__.py"}
        assert named.get(folder) == there, (f"README's Layout, {folder}: missing {sorted(there - named[folder])}, "
                                            f"not in the tree {sorted(named[folder] - there)}")
    for folder in named:
        assert os.path.exists(os.path.join(ROOT, folder)), f"README's Layout names {folder}, which is not there"


def test_the_layout_check_reads_a_missing_module_as_missing(monkeypatch):
    """The check above can fail: a Layout that leaves out one module of common/ is caught."""
    real = layout_block()
    monkeypatch.setattr(__import__(__name__), "layout_block",
                        lambda: {**real, "common/": real["common/"] - {"p2p.py"}})
    try:
        test_the_readme_layout_names_every_module_of_common_and_the_runner()
    except AssertionError as exc:
        assert "missing ['p2p.py']" in str(exc)
    else:
        raise AssertionError("a Layout without common/p2p.py passed")
