"""The house: lessons and the modules they use never import the runner's package (common/runner/)."""
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
    lesson_side = glob.glob(os.path.join(ROOT, "common", "*.py")) + glob.glob(os.path.join(ROOT, "lessons", "*.py"))
    wrong = [f"{os.path.relpath(p, ROOT)} imports {mod}" for p in lesson_side for mod, names in imports(p)
             if mod.startswith("common.runner") or (mod == "common" and "runner" in names)]
    assert len(lesson_side) > 10 and not wrong, wrong
