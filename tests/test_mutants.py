"""tests/mutants.py: its mutants are the edits it names, inside exercise regions only, staged exactly
as the wrong-answer suite stages an edit; one real run grades two of lesson 03's."""
import json
import os
import subprocess
import sys

import pytest

import mutants
from common.runner import catalog, exercise
from conftest import ROOT
from test_wrong_answers import edit

TINY = '''import math


def f(rank, n, items):
    total = 0
    # >>> exercise: demo
    left = (rank - 1) % n
    if left < n:
        total = min(items[left], n // 2)
    # <<< exercise: demo
    return total + 1 - n // 2
'''


def _tiny():
    regions = exercise.find_regions(TINY)
    return regions, mutants.mutations(TINY, regions)


def test_the_mutants_are_the_mechanical_edits():
    regions, found = _tiny()
    lines = {(m.kind, m.apply(TINY).splitlines()[m.line - 1].strip()) for m in found}
    for want in [("op", "left = (rank - 1) // n"), ("op", "left = (rank + 1) % n"),
                 ("drop", "left = (rank) % n"), ("const", "left = (rank - 2) % n"),
                 ("const", "left = (rank - 0) % n"), ("compare", "if left <= n:"),
                 ("minmax", "total = max(items[left], n // 2)"), ("index", "total = min(items[left + 1], n // 2)"),
                 ("index", "total = min(items[left - 1], n // 2)"), ("op", "total = min(items[left], n % 2)"),
                 ("name", "if rank < n:"), ("name", "left = (n - 1) % n")]:
        assert want in lines, f"no mutant {want}"
    # items is indexed, the others are plain numbers: no number stands in for it, nor it for one
    assert not any("items" in new and "items[" not in new for kind, new in lines if kind == "name")
    assert not any(new.startswith("left = (items") for kind, new in lines)
    # total is bound before the region, left only by its first line: no use of left before then
    assert ("name", "left = (left - 1) % n") not in lines and ("name", "if total < n:") in lines
    assert sorted(m.id for m in found) == [f"m{i:03d}" for i in range(1, len(found) + 1)]


def test_no_mutant_edits_outside_its_region():
    regions, found = _tiny()
    (r,) = regions
    before = TINY.splitlines()
    for m in found:
        after = m.apply(TINY).splitlines()
        assert len(after) == len(before)
        changed = [i + 1 for i, (x, y) in enumerate(zip(before, after)) if x != y]
        assert changed == [m.line] and r.begin < m.line < r.end, m
    assert not any(m.line > r.end for m in found)  # `return total + 1 - n // 2` is never touched


def test_every_lesson_mutant_stages_as_the_wrong_answer_suite_stages_it():
    """For every lesson, each mutant parses, edits its own region only, and staged through
    test_wrong_answers.edit is exactly the mutated source (the staged copy is the mutant)."""
    for lesson in catalog.lessons(os.path.join(ROOT, "lessons")):
        with open(lesson.path) as f:
            source = f.read()
        regions = {r.name: r for r in exercise.find_regions(source, lesson.path)}
        assert edit(source, mutants.staged_case(source, next(iter(regions.values()))), lesson.path) == source
        found = mutants.mutations(source, list(regions.values()))
        assert found, f"{lesson.name}: no mutants"
        for i, m in enumerate(found):
            r = regions[m.region]
            start, end = source.count("\n", 0, m.start) + 1, source.count("\n", 0, m.end) + 1
            assert r.begin < start <= end < r.end, f"{lesson.name} {m}"
            if i % max(1, len(found) // 12) == 0:  # a dozen a lesson, spread over its regions: staging is slow
                assert edit(source, mutants.staged_case(source, r, m), lesson.path) == m.apply(source), m


def test_a_sample_draws_every_kind_and_is_the_same_for_a_seed():
    _, found = _tiny()
    kinds = {m.kind for m in found}
    drawn = mutants.sample(found, len(kinds), seed=3)
    assert {m.kind for m in drawn} == kinds and len(drawn) == len(kinds)
    assert [m.id for m in drawn] == [m.id for m in mutants.sample(found, len(kinds), seed=3)]
    assert [m.id for m in drawn] == sorted(m.id for m in drawn)
    assert mutants.sample(found, None, 0) == found and mutants.sample(found, 10 ** 6, 0) == found


def test_an_unknown_lesson_is_one_line_and_exit_2(capsys):
    assert mutants.main(["99"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_two_of_lesson_03s_mutants_graded_for_real(tmp_path):
    path = os.path.join(ROOT, "lessons", "03_broadcast_scatter.py")
    with open(path) as f:
        before = f.read()
    out = tmp_path / "mutants.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "mutants.py"), "03", "--sample", "2",
                           "--json", str(out)], cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["graded"] == 2 and doc["killed"] + doc["survived"] == 2
    assert doc["killed"] >= 1, done.stdout  # the grading can kill: lesson 03's checks catch these edits
    assert {m["verdict"] for m in doc["mutants"]} <= {"killed", "survived"}
    assert all(len(line) <= 100 for line in done.stdout.splitlines()), done.stdout
    with open(path) as f:
        assert f.read() == before, "the lesson itself was edited"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
