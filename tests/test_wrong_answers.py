"""Wrong answers as tests: typical learner mistakes, each of which must fail a named check.

tests/wrong_answers/NN_topic.yaml holds a list of mistakes for lesson NN, each one edit of the lesson:

    - mistake: the norm is scaled by each rank's own max |g|, not the global max
      region: l2_norm              # the exercise region whose body `code` replaces (indented for you)
      code: |
        scale = float(np.max(np.abs(g)))
        ...
      fails: the distributed L2 norm equals one process's   # a check name from the lesson's YAML, or
      crashes: wrong sum           # text of the error a rank's own self-check (an assert) stops with
      says: the distributed L2 norm                          # optional: text the learner is shown
      np: 3                        # optional: default the largest NP of the YAML's check list
      api: mpi4py                  # optional (default mpi4py); args: [...] optional (default YAML args)
    - mistake: ...
      replace: [["old text, found exactly once", "new text"], ...]     # instead of region + code
      passes: another valid convention     # instead of fails: a correct variant that must pass

tests/wrong_answers/gpu_double.yaml holds bugs planted in the lessons' CuPy + NCCL path, run under the GPU
double (tests/gpu_double): each case names its `lesson: "NN"` and may say `hangs: why` (the run must hit
its `timeout:`, as a real NCCL deadlock would) instead of fails / crashes.

A check no wrong answer can fail is not a check; a correct variant that fails is a check too strict.
"""
import os

import pytest
import yaml

from common.runner import catalog, engine, exercise
from conftest import ROOT

FOLDER = os.path.join(ROOT, "tests", "wrong_answers")
KEYS = {"mistake", "region", "code", "replace", "fails", "crashes", "hangs", "passes", "says", "np", "api",
        "args", "lesson", "device", "timeout"}
VERDICTS = ("fails", "crashes", "hangs", "passes")
GPU_FILE = "gpu_double.yaml"


def edit(source, case, where):
    """The lesson's source with the case's one edit made (ValueError when it does not apply)."""
    if "region" in case:
        lines = source.splitlines(keepends=True)
        regions = {r.name: r for r in exercise.find_regions(source, where)}
        if case["region"] not in regions:
            raise ValueError(f"{where}: no exercise region {case['region']!r}")
        r = regions[case["region"]]
        body = [(r.indent + line if line.strip() else line) + "\n" for line in case["code"].splitlines()]
        lines[r.begin:r.end - 1] = body
        return "".join(lines)
    for old, new in case["replace"]:
        if source.count(old) != 1:
            raise ValueError(f"{where}: {old!r} occurs {source.count(old)} times, not once")
        source = source.replace(old, new)
    return source


def _cases():
    cases = []
    for name in sorted(os.listdir(FOLDER)) if os.path.isdir(FOLDER) else []:
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(FOLDER, name)) as f:
            for i, case in enumerate(yaml.safe_load(f) or []):
                lid = str(case["lesson"]) if name == GPU_FILE else name.split("_")[0]
                lesson = catalog.resolve(lid, os.path.join(ROOT, "lessons"))
                verdict = case.get("fails") or case.get("crashes") or case.get("hangs") and "hangs" or "passes"
                tag = f"{'gpu-' if name == GPU_FILE else ''}{lesson.id}-{i}-{verdict}"
                cases.append(pytest.param(lesson, case, id=tag[:90]))
    return cases


CASES = _cases()


def test_there_are_wrong_answers_for_every_exercise_region():
    covered = {(lesson.name, case.get("region")) for lesson, case in (p.values for p in CASES)}
    missing = []
    for lesson in catalog.lessons(os.path.join(ROOT, "lessons")):
        with open(lesson.path) as f:
            missing += [f"{lesson.name}:{r.name}" for r in exercise.find_regions(f.read(), lesson.path)
                        if (lesson.name, r.name) not in covered]
    assert not missing, f"exercise regions with no wrong answer: {missing}"


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    from gpu_double import env
    return env(str(tmp_path_factory.mktemp("gpu_double")))


@pytest.mark.parametrize("lesson, case", CASES)
def test_wrong_answer_fails_its_check(lesson, case, tmp_path, monkeypatch, request):
    assert set(case) <= KEYS and "mistake" in case, f"unknown keys {set(case) - KEYS}"
    assert ("region" in case) != ("replace" in case) and sum(k in case for k in VERDICTS) == 1
    names = [c["name"] for c in lesson.meta["expect"]]
    assert case.get("fails", names[0]) in names, f"{case['fails']!r} is not a check of {lesson.name}"
    with open(lesson.path) as f:
        source = f.read()
    script = tmp_path / os.path.basename(lesson.path)
    script.write_text(edit(source, case, lesson.path))
    monkeypatch.setenv("PYTHONPATH", ROOT)  # the copy lives in tmp_path, away from common/
    device = case.get("device", "cpu")
    if device == "gpu":  # the double's PYTHONPATH puts its cupy first, then ROOT
        for key, value in request.getfixturevalue("double").items():
            monkeypatch.setenv(key, value)
    np = case.get("np", max(lesson.meta["np"]["check"]))
    outcome, checks = engine.run_lesson(lesson, np, case.get("api", "mpi4py"), device,
                                        case.get("args", lesson.meta.get("args", [])), echo=False,
                                        script=str(script), timeout=case.get("timeout"))
    said = "\n".join(exercise.explain(lesson, outcome, checks, str(script), engine.explain(lesson, outcome, checks)))
    if "passes" in case:
        assert engine.ok(outcome, checks), f"a correct variant ({case['mistake']}) fails:\n{said}"
        return
    if "hangs" in case:
        assert outcome.timed_out, f"the bug '{case['mistake']}' did not hang (exit {outcome.rc}):\n{said}"
    elif "crashes" in case:
        errors = "\n".join(outcome.errors.values())
        assert outcome.rc != 0 and case["crashes"] in errors, (
            f"the mistake '{case['mistake']}' did not stop a rank with {case['crashes']!r}:\n{said}")
    else:
        failed = [c["name"] for c in checks or [] if not c["ok"]]
        assert case["fails"] in failed, (f"the mistake '{case['mistake']}' did not fail "
                                         f"'{case['fails']}' (failed: {failed}, exit {outcome.rc}):\n{said}")
    if "says" in case:
        assert case["says"] in said, f"the learner is not told {case['says']!r}:\n{said}"
