"""Wrong answers as tests: typical learner mistakes, each of which must fail a named check.

tests/wrong_answers/NN_topic.yaml holds a list of mistakes for lesson NN, each one edit of the lesson:

    - mistake: the norm is scaled by each rank's own max |g|, not the global max
      region: l2_norm              # the exercise region whose body `code` replaces (indented for you)
      code: |
        scale = float(np.max(np.abs(g)))
        ...
      fails: the distributed L2 norm equals one process's   # a check name from the lesson's YAML, or a
                                                            # list of them: the run must fail every one
      crashes: wrong sum           # text of the error a rank's own self-check (an assert) stops with
      says: the distributed L2 norm                          # optional: text the learner is shown
      np: 3                        # optional: default the largest NP of the YAML's check list
      api: mpi4py                  # optional (default mpi4py); args: [...] optional (default YAML args)
    - mistake: ...
      replace: [["old text, found exactly once", "new text"], ...]     # instead of region + code
      passes: another valid convention     # instead of fails: a correct variant that must pass
    - mistake: ...
      file: lessons/allreduce_algorithms/schedules.py   # optional: the edit is made in this module of the
      replace: [[...]]                     # lesson's own folder (lessons/<topic>/), not in the page itself;
                                           # or a module of common/ (the package is copied whole)

The run imports the edited copy: the lesson and the edited file are copied to tmp_path/lessons/, and
tmp_path comes first on sys.path (the lesson puts its parent folder there, and PYTHONPATH starts with
it), so the namespace packages `lessons` and `lessons.<topic>` (no __init__.py) find
tmp_path/lessons/<topic>/x.py before ROOT's,
and a `common/` case's tmp_path/common is the package `common` the ranks import.

tests/wrong_answers/gpu_double.yaml holds bugs planted in the lessons' CuPy + NCCL path, run under the GPU
double (tests/gpu_double): each case names its `lesson: "NN"` and may say `hangs: why` (the run must hit
its `timeout:`, as a real NCCL deadlock would) instead of fails / crashes.

`make test` runs the first case of each exercise region (of each `file:`, of the page's `replace:`
cases), so every region's grading is exercised on every run; the rest of the catalogue is marked slow
and runs in `make test-torch` (CI runs both).

A check no wrong answer can fail is not a check; a correct variant that fails is a check too strict.
test_every_check_can_fail holds each lesson to that: each check of its YAML is named by some case's
`fails:`, or listed in CANNOT_FAIL with the reason no learner mistake can fail it.
"""
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from common.runner import catalog, exercise, lesson_run, verdict
from conftest import ROOT, torch_marks

FOLDER = os.path.join(ROOT, "tests", "wrong_answers")
KEYS = {"mistake", "region", "code", "replace", "fails", "crashes", "hangs", "passes", "says", "np", "api",
        "args", "lesson", "device", "timeout", "file"}
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
    cases, seen, resolved = [], set(), {}
    for name in sorted(os.listdir(FOLDER)) if os.path.isdir(FOLDER) else []:
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(FOLDER, name)) as f:
            for i, case in enumerate(yaml.load(f, Loader=catalog.LOADER) or []):
                lid = str(case["lesson"]) if name == GPU_FILE else name.split("_")[0]
                if lid not in resolved:
                    resolved[lid] = catalog.resolve(lid, os.path.join(ROOT, "lessons"))
                lesson = resolved[lid]
                fails = failed_names(case)
                verdict = (fails and fails[0] + (f" +{len(fails) - 1}" if len(fails) > 1 else "")
                           or case.get("crashes") or case.get("hangs") and "hangs" or "passes")
                tag = f"{'gpu-' if name == GPU_FILE else ''}{lesson.id}-{i}-{verdict}"
                marks = list(torch_marks(lesson.name, case.get("api", "mpi4py")))
                where = (name, case.get("region") or case.get("file") or "page")
                if where in seen:  # make test runs each region's first case; the rest: make test-torch
                    marks.append(pytest.mark.slow)
                seen.add(where)
                cases.append(pytest.param(lesson, case, id=tag[:90], marks=marks))
    return cases


def failed_names(case):
    """The check names a case's `fails:` gives (one name or a list), [] when it has none."""
    fails = case.get("fails") or []
    return [fails] if isinstance(fails, str) else list(fails)


def stage(lesson, case, folder):
    """Write the lesson, and the helper module a `file:` case edits, to folder/lessons/ with the case's
    edit made; return (the script to run, the PYTHONPATH head that makes the copies win). A `file:` in
    common/ copies the whole package to folder/common, so the ranks import the edited helper."""
    target = os.path.join(ROOT, case["file"]) if "file" in case else lesson.path
    where = os.path.dirname(os.path.relpath(os.path.abspath(target), ROOT))
    shared, own = where == "common", os.path.join("lessons", lesson.name.split("_", 1)[1])
    if "file" in case and not shared and where != own:
        raise ValueError(f"file: {case['file']} is neither in {own}/ (the lesson's own modules) nor in common/")
    os.makedirs(os.path.join(folder, "lessons"), exist_ok=True)
    if shared:
        shutil.copytree(os.path.join(ROOT, "common"), os.path.join(folder, "common"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for path in {lesson.path, target}:
        with open(path) as f:
            source = f.read()
        copy = os.path.join(folder, where, os.path.basename(path)) if path == target else \
            os.path.join(folder, "lessons", os.path.basename(path))
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        with open(copy, "w") as f:
            f.write(edit(source, case, path) if path == target else source)
    return os.path.join(folder, "lessons", os.path.basename(lesson.path)), str(folder)


def judge(case, outcome, checks, said):
    """AssertionError unless the run went as the case says (fails / crashes / hangs / passes, says)."""
    if "passes" in case:
        assert verdict.ok(outcome, checks), f"a correct variant ({case['mistake']}) fails:\n{said}"
        return
    if "hangs" in case:
        assert outcome.timed_out, f"the bug '{case['mistake']}' did not hang (exit {outcome.rc}):\n{said}"
    elif "crashes" in case:
        errors = "\n".join(outcome.errors.values())
        assert outcome.rc != 0 and case["crashes"] in errors, (
            f"the mistake '{case['mistake']}' did not stop a rank with {case['crashes']!r}:\n{said}")
    else:
        failed = [c["name"] for c in checks or [] if not c["ok"]]
        missed = [name for name in failed_names(case) if name not in failed]
        assert not missed, (f"the mistake '{case['mistake']}' did not fail {missed} "
                            f"(failed: {failed}, exit {outcome.rc}):\n{said}")
    if "says" in case:
        assert case["says"] in said, f"the learner is not told {case['says']!r}:\n{said}"


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
    unknown = [name for name in failed_names(case) if name not in names]
    assert "fails" not in case or (failed_names(case) and not unknown), \
        f"{unknown or case['fails']!r}: not checks of {lesson.name}"
    script, head = stage(lesson, case, tmp_path)
    # the copies live in tmp_path/lessons, first on the path; common/ and the other modules from ROOT
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([head, ROOT]))
    device = case.get("device", "cpu")
    if device == "gpu":  # the double's PYTHONPATH puts its cupy first, then ROOT
        for key, value in request.getfixturevalue("double").items():
            monkeypatch.setenv(key, os.pathsep.join([head, value]) if key == "PYTHONPATH" else value)
    np = case.get("np", max(lesson.meta["np"]["check"]))
    outcome, checks = lesson_run.run_lesson(lesson, np, case.get("api", "mpi4py"), device,
                                        case.get("args", lesson.meta.get("args", [])), echo=False,
                                        script=script, timeout=case.get("timeout"))
    why = verdict.explain(lesson, outcome, checks)
    said = "\n".join(exercise.explain_for_learner(lesson, outcome, checks, script, why))
    if lesson.meta.get("expects_death") and verdict.status(outcome, checks) == "blocked":  # 18's MPI path
        pytest.skip(f"{case['mistake']}: {outcome.blocked}")
    judge(case, outcome, checks, said)


# Checks no learner mistake can fail here, each with the reason; every other check of every lesson's
# YAML must be named by some case's `fails:` (test_every_check_can_fail).
CANNOT_FAIL = {
    "00_hello": {
        "all-reduce of the rank ids is N(N-1)/2 on every rank":
            "the lesson asserts the same sum before it reports: a wrong all-reduce stops the run (a crashes case)",
    },
    "15_hierarchy": {
        "the flat ring's edge ranks send all they send across: 2C less two of N uneven chunks":
            "the flat ring is lesson 05's, graded there (its wrong answers); here it is the measured "
            "baseline, which no code of this lesson's exercises reaches",
    },
    "09_reduce_scatter_alltoall": {
        name: "the library's bytes on its sockets, not the learner's code: it fails when a torch release "
              "changes gloo's calls, and so the lesson's words about them"
        for name in ("gloo has no reduce-scatter: its call writes an all-reduce's 2(N-1)/N of the buffer to "
                     "the sockets", "gloo's all-gather is a real one: (N-1)/N of the buffer to the sockets")
    },
}


def covered_checks(lesson):
    return {name for les, case in (p.values for p in CASES) if les.name == lesson.name
            for name in failed_names(case)}


@pytest.mark.parametrize("lesson", catalog.lessons(os.path.join(ROOT, "lessons")), ids=lambda les: les.id)
def test_every_check_can_fail(lesson):
    lesson = catalog.resolve(lesson.id, os.path.join(ROOT, "lessons"))
    names = [c["name"] for c in lesson.meta["expect"]]
    excused = CANNOT_FAIL.get(lesson.name, {})
    stale = set(excused) - set(names)
    assert not stale, f"CANNOT_FAIL names no check of {lesson.name}: {stale}"
    assert not set(excused) & covered_checks(lesson), \
        f"CANNOT_FAIL excuses checks a case fails: {set(excused) & covered_checks(lesson)}"
    missing = [name for name in names if name not in covered_checks(lesson) and name not in excused]
    assert not missing, (f"{len(missing)} of {len(names)} checks of {lesson.name} are failed by no wrong answer "
                         f"(tests/wrong_answers/{lesson.name}.yaml):\n  " + "\n  ".join(missing))


def test_a_file_case_runs_the_edited_helper(tmp_path):
    """The staged lesson imports the edited helper from tmp_path/lessons, and the others from ROOT."""
    lesson = catalog.resolve("07", os.path.join(ROOT, "lessons"))
    case = {"file": "lessons/allreduce_algorithms/schedules.py",
            "replace": [["def fold(n):", "STAGED = 1\n\n\ndef fold(n):"]]}
    script, head = stage(lesson, case, tmp_path)
    probe = ("import importlib.util, sys\n"
             f"spec = importlib.util.spec_from_file_location('lesson', {script!r})\n"
             "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
             "from lessons.allreduce_algorithms import schedules as s, model as m\n"
             "print(s.STAGED, s.__file__, m.__file__)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([head, ROOT])})
    assert done.returncode == 0, done.stderr
    folder = os.path.join("lessons", "allreduce_algorithms")
    assert done.stdout.split() == ["1", str(tmp_path / folder / "schedules.py"), os.path.join(ROOT, folder, "model.py")]
    assert "STAGED" not in open(os.path.join(ROOT, folder, "schedules.py")).read()
    with pytest.raises(ValueError, match="occurs 0 times"):
        stage(lesson, {"file": "lessons/allreduce_algorithms/model.py", "replace": [["def fold(n):", ""]]}, tmp_path)
    with pytest.raises(ValueError, match="the lesson's own modules"):  # another lesson's folder is not its own
        stage(lesson, {"file": "lessons/pipeline_parallel/schedules.py", "replace": [["a", "b"]]}, tmp_path)


class _Ran:
    def __init__(self, rc=0, errors=None, timed_out=False):
        self.rc, self.errors, self.timed_out = rc, errors or {}, timed_out


def test_a_mistake_must_fail_every_check_it_names():
    checks = [{"name": "a", "ok": False}, {"name": "b", "ok": True}]
    judge({"mistake": "m", "fails": "a"}, _Ran(1), checks, "")
    judge({"mistake": "m", "fails": ["a"]}, _Ran(1), checks, "")
    with pytest.raises(AssertionError, match=r"did not fail \['b'\]"):
        judge({"mistake": "m", "fails": ["a", "b"]}, _Ran(1), checks, "")
    with pytest.raises(AssertionError, match=r"did not fail \['a'\]"):
        judge({"mistake": "m", "fails": "a"}, _Ran(1), None, "")  # a crash before the results fails nothing


# The shape rule (issue 36): `bin/tutor check` grades every exercise where the usual confusions give
# different answers. At NP 4 = 2 x 2, `rank // K` and `rank % K` agree, as do a node's count and its
# size, and every power of two hides an off-by-one in a halving; so the check NPs hold one that is
# neither a power of two nor a square, from 3 up. A lesson that places ranks in groups grades both block
# and round-robin placement, with more groups than ranks in a group in one and fewer in the other; a
# lesson that plants faults on a rank grades them on rank 0 and on the last rank. The rules read the
# YAML and the lesson's sources, so a new lesson meets them from its first commit.
SHAPE_EXEMPT = {
    "06_gil_timings": "its exercises time threads and processes inside one rank; the second rank only waits "
                      "in Recv, so no rank arithmetic is graded",
    "16_scale_on_paper": "priced on paper: its shapes are the clusters of its figures (8 GPUs a node, 1-128 "
                         "nodes, 1-8 NICs) and the dry run's 1024 GPUs, not the ranks that run it",
}


def _lesson_text(lesson):
    from common.runner import schema
    text = ""
    for path in schema.lesson_sources(lesson.path):
        with open(path, encoding="utf-8") as f:
            text += f.read()
    return text


LESSONS = [catalog.resolve(les.id, os.path.join(ROOT, "lessons"))
           for les in catalog.lessons(os.path.join(ROOT, "lessons"))]
PLACING = [les for les in LESSONS if "round-robin" in _lesson_text(les)]   # ranks placed in groups
# faults planted on a rank: a hang (14's --fault-rank), a flipped bit or a swap in a replica (17's --flip-rank)
PLANTING = [les for les in LESSONS if "--fault-rank" in _lesson_text(les) or "--flip-rank" in _lesson_text(les)]


def _telling(n):
    """An NP where the usual confusions differ: at least 3, not a power of two, not a square."""
    return n >= 3 and n & (n - 1) != 0 and int(n ** 0.5) ** 2 != n


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda les: les.id)
def test_every_lesson_is_graded_at_an_np_where_mistakes_differ(lesson):
    nps = lesson.meta["np"]["check"]
    if lesson.name in SHAPE_EXEMPT:
        assert not any(_telling(n) for n in nps), f"{lesson.name} is graded at a telling NP: drop its exemption"
        return
    assert any(_telling(n) for n in nps), \
        f"{lesson.name} is checked at NP {nps} only: add one of 3, 5, 6, 7 (not a power of two, not a square)"


@pytest.mark.parametrize("lesson", PLACING, ids=lambda les: les.id)
def test_placed_groups_are_graded_block_and_round_robin(lesson):
    args = lesson.meta.get("args", [])
    assert "--groups" in args, f"{lesson.name} places ranks in groups but its check names no --groups"
    shapes = {}
    for entry in args[args.index("--groups") + 1].split(","):
        size, placement = entry.split(":")
        m, k = map(int, size.split("x"))
        assert m * k in lesson.meta["np"]["check"], f"--groups {entry}: NP {m * k} is not a check NP"
        shapes.setdefault(placement, []).append((m, k))
    assert set(shapes) >= {"block", "round-robin"}, f"{lesson.name} grades only {sorted(shapes)} placement"
    every = [s for got in shapes.values() for s in got]
    assert any(m > k for m, k in every) and any(k > m for m, k in every), \
        f"{lesson.name}: groups {every} need one shape with more groups than ranks a group, one with fewer"


@pytest.mark.parametrize("lesson", PLANTING, ids=lambda les: les.id)
def test_planted_faults_are_graded_on_rank_0_and_the_last_rank(lesson):
    names = " / ".join(c["name"] for c in lesson.meta["expect"])
    assert "rank 0" in names and "last rank" in names, \
        f"{lesson.name} plants faults on a rank but no check grades them on rank 0 and on the last rank"
    nps = lesson.meta["np"]["check"]
    assert 2 in nps, f"{lesson.name}: NP 2 (no majority: a tie) must be a check NP"


def test_the_shape_rules_find_the_lessons_they_are_for():
    """The rules above pick lessons by their sources: 15 places ranks in groups, 14 and 17 plant faults."""
    assert [les.id for les in PLACING] == ["15"] and [les.id for les in PLANTING] == ["14", "17"]
