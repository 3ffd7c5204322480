"""Practice mode: exercise regions, stubs, the learner's copy, progress, hints, and the answer-key proof.

The answer-key proof (last tests) runs every exercise region of every lesson in lessons/: with only that
region stubbed, some NP of the YAML check list must fail a check or crash (mpi4py API, the YAML's
`args:`). Its other half, the lesson itself passing that same run, is tests/test_lessons.py's mpi4py case,
so it is not run twice (the fixture test below runs both halves through answer_key).
"""
import json
import os
import textwrap
import time

import pytest

from common.plumbing import run_folder
from common.runner import catalog, exercise, lesson_run, practice, practice_grading, progress, supervise, verdict
from common.text import path_shown
from conftest import FIXTURES, ROOT, torch_marks, tutor

PRACTICE_FIXTURES = os.path.join(FIXTURES, "exercise_lessons")  # .gitignore hides "practice/"

SOURCE = textwrap.dedent('''\
    def f(x):
        y = 1
        # >>> exercise: first
        y = x + 1
        z = y * 2
        # <<< exercise: first
        if x:
            # >>> exercise: second
            return z
            # <<< exercise: second
        return y
''')


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Practice copies and progress in a temp folder; the copies import common/ via PYTHONPATH."""
    monkeypatch.setenv("TUTOR_PRACTICE", str(tmp_path / "practice"))
    monkeypatch.setenv("TUTOR_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("TUTOR_LESSONS", PRACTICE_FIXTURES)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    return tmp_path


# ---- regions and stubs -------------------------------------------------------------------------

def test_find_regions_names_lines_and_indent():
    regions = exercise.find_regions(SOURCE)
    assert [(r.name, r.begin, r.end, r.indent) for r in regions] == [
        ("first", 3, 6, "    "), ("second", 8, 10, "        ")]
    assert regions[0].body(SOURCE.splitlines()) == ["    y = x + 1", "    z = y * 2"]


@pytest.mark.parametrize("text, complaint", [
    ("    # >>> exercise: a\n    x = 1\n", "never closed"),
    ("    # >>> exercise: a\n    x = 1\n    # <<< exercise: b\n", "does not close"),
    ("    # >>> exercise: a\n    x = 1\n  # <<< exercise: a\n", "same indentation"),
    ("    # >>> exercise: a\n    # >>> exercise: b\n", "starts inside"),
    ("    # >>> exercise: a\n    # <<< exercise: a\n", "no code"),
    ("    # >>> exercise: a\n    x\n    # <<< exercise: a\n    # >>> exercise: a\n    y\n"
     "    # <<< exercise: a\n", "marked twice"),
])
def test_find_regions_rejects_malformed_markers(text, complaint):
    with pytest.raises(exercise.PracticeError, match=complaint):
        exercise.find_regions(text, "x.py")


def test_stub_keeps_markers_and_fails_loudly():
    stub = exercise.make_stub(SOURCE, "07")
    assert "y = x + 1" not in stub and "return z" not in stub
    assert stub.count("# >>> exercise:") == 2 and stub.count("bin/tutor hint 07") == 2
    assert [r.name for r in exercise.find_regions(stub)] == ["first", "second"]  # the copy re-parses
    space = {}
    exec(compile(stub, "stub.py", "exec"), space)
    with pytest.raises(NotImplementedError, match="exercise first"):
        space["f"](0)
    assert exercise.make_stub("x = 1\n") == "x = 1\n"


def test_stub_of_one_region_leaves_the_others():
    stub = exercise.make_stub(SOURCE, "07", only="second")
    assert "y = x + 1" in stub and "return z" not in stub and stub.count("NotImplementedError") == 1
    space = {}
    exec(compile(stub, "stub.py", "exec"), space)
    assert space["f"](0) == 1  # the first region still runs
    with pytest.raises(NotImplementedError, match="exercise second"):
        space["f"](1)


# ---- grading one idea at a time (common/runner/practice_grading.py) ---------------------------------------

def _written(first=None, second=None):
    """The learner's copy of SOURCE with a region's TODO replaced by `first` / `second` lines."""
    stub = exercise.make_stub(SOURCE, "07")
    lines = stub.splitlines(keepends=True)
    for r in reversed(exercise.find_regions(stub)):
        code = {"first": first, "second": second}[r.name]
        if code is not None:
            lines[r.begin:r.end - 1] = [r.indent + c + "\n" for c in code]
    return "".join(lines)


def test_an_untouched_region_runs_the_reference_and_lines_map_back(tmp_path, monkeypatch):
    mine = _written(first=["y = x + 1", "y = y + 0", "z = y * 2", "assert x != 5, 'mine'"])
    plan = practice_grading.splice(SOURCE, mine, "practice/f.py", "lessons/f.py", "07")
    assert (plan.mine, plan.reference) == (["first"], ["second"])
    assert plan.notes() == ["exercise second: still the TODO, so the lesson's reference runs in its place; "
                            "graded: your first"]
    launched = plan.text.splitlines()
    at = launched.index("        return z")  # the reference's line, at the copy's indentation
    assert plan.origin[at] == ("lessons/f.py", 9)
    mine_at = launched.index("    assert x != 5, 'mine'")
    assert plan.origin[mine_at] == ("practice/f.py", mine.splitlines().index("    assert x != 5, 'mine'") + 1)
    monkeypatch.setenv(run_folder.ENV, str(tmp_path))
    space = {}
    exec(compile(plan.text, "launched.py", "exec"), space)
    assert space["f"](0) == 1 and run_folder.ran_regions(tmp_path) == {"first"} and len(os.listdir(tmp_path)) == 1
    assert space["f"](1) == 4 and run_folder.ran_regions(tmp_path) == {"first", "second"}
    with pytest.raises(AssertionError) as err:  # and what a traceback says maps back to the copy
        space["f"](5)
    out = supervise.Outcome(rc=1, seconds=0, errors={0: f"AssertionError: mine (launched.py:{mine_at + 1})"},
                         tail=[f'  File "launched.py", line {at + 1}, in f'],
                         stacks={0: [("f", f"launched.py:{mine_at + 1}")]})
    practice_grading.relabel(out, plan, "launched.py")
    line = plan.origin[mine_at][1]
    assert out.errors[0] == f"AssertionError: mine (practice/f.py:{line})" and "mine" in str(err.value)
    assert out.tail == ['  File "lessons/f.py", line 9, in f'] and out.stacks[0] == [("f", f"practice/f.py:{line}")]


def test_a_copy_with_nothing_written_is_refused_before_a_launch():
    with pytest.raises(exercise.PracticeError, match=r"nothing to check yet: .*first \(practice/f.py:4\), "
                                                     r"second \(practice/f.py:9\).*no run was started"):
        practice_grading.splice(SOURCE, exercise.make_stub(SOURCE, "07"), "practice/f.py", "lessons/f.py", "07")
    both = practice_grading.splice(SOURCE, _written(first=["y = 3", "z = 4"], second=["return 0"]),
                                   "p.py", "l.py", "07")
    assert both.mine == ["first", "second"] and both.reference == [] and both.notes() == []


def test_a_value_every_rank_got_alike_is_said_once(sandbox):
    lesson = catalog.resolve("01")
    checks = [{"name": "sum of rank+1 is N(N+1)/2", "ok": False, "want": "== 10",
               "got": [f"rank {r}: 0.00054824986801602" for r in range(4)]}]
    lines = exercise.explain_for_learner(lesson, supervise.Outcome(rc=0, seconds=0), checks, lesson.path, [])
    assert lines == ['check failed: "sum of rank+1 is N(N+1)/2": wanted ranks[*].sum == 10, but got '
                     "ranks 0-3: 0.00054825"]


def test_a_run_that_never_reached_your_code_is_not_graded():
    plan = practice_grading.Splice("p.py", "l.py", "", mine=["spread"], reference=["double"])
    passed = supervise.Outcome(rc=0, seconds=0, ran={"double"})
    assert practice.graded_verdict(plan, passed, "pass", [])[0] == "not graded"
    failed = practice.graded_verdict(plan, passed, "fail", ["check failed: x"])
    assert failed == ("fail", ["check failed: x", "(this run never reached your spread)"])
    assert practice.graded_verdict(plan, supervise.Outcome(rc=0, seconds=0, ran={"spread"}), "pass", []) == ("pass", [])


def test_one_idea_at_a_time(sandbox):
    """03_two_ideas: `double` runs at every NP, `spread` only above one rank. The untouched copy is
    refused before a launch; a wrong `double` fails its own check while `spread` runs the reference;
    a right `spread` passes where it runs and the NP 1 run, which never reaches it, is not graded."""
    env = dict(os.environ)
    assert tutor("practice", "03", env=env).returncode == 0
    path = os.path.join(sandbox, "practice", "03_two_ideas.py")
    stub = open(path).read()
    untouched = tutor("check", "03", "--mine", env=env)
    assert untouched.returncode == 1 and "lesson  np" not in untouched.stdout, untouched.stdout
    assert "nothing to check yet" in untouched.stderr and "03_two_ideas.py:13" in untouched.stderr

    def fill(region, code):
        return stub.replace(f'raise NotImplementedError("exercise {region}: not done yet")', code)
    open(path, "w").write(fill("double", "y = x + x + 1"))
    wrong = tutor("check", "03", "--mine", env=env)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "note: exercise spread: still the TODO, so the lesson's reference runs in its place" in wrong.stdout
    assert 'check failed: "double gives twice rank+1"' in wrong.stderr and "spread hears" not in wrong.stderr
    assert "not done yet" not in wrong.stderr and "2 failed" in wrong.stdout
    wide = [line for line in (wrong.stdout + wrong.stderr).splitlines() if len(line) > 100]
    assert all(line.strip(" ;") == path_shown(path) for line in wide), wide  # only a path too long to break
    open(path, "w").write(fill("spread", "got = ctx.comm.allgather(ctx.rank)"))
    right = tutor("check", "03", "--mine", env=env)
    assert right.returncode == 0, right.stdout + right.stderr
    rows = [l.split() for l in right.stdout.splitlines() if l.startswith("03_two_ideas ")]
    assert [(r[1], r[-1]) for r in rows] == [("1", "graded"), ("2", "✓")], right.stdout
    assert "1 passed, 0 failed, 1 not graded" in right.stdout
    assert "never reached your spread" in right.stderr
    assert "next, write exercise double" in right.stdout and practice.state(catalog.resolve("03")) == "in progress"


# ---- the learner's copy, progress, hints, solution ---------------------------------------------

def test_copy_is_never_overwritten_without_force(sandbox):
    lesson = catalog.resolve("01")
    path, regions, backup = practice.write_copy(lesson)
    assert [r.name for r in regions] == ["allreduce"] and backup is None
    with open(path, "a") as f:
        f.write("# my work\n")
    with pytest.raises(exercise.PracticeError, match="--force"):
        practice.write_copy(lesson)
    assert open(path).read().endswith("# my work\n")
    path, _, backup = practice.write_copy(lesson, force=True)
    assert open(backup).read().endswith("# my work\n") and "# my work" not in open(path).read()
    assert practice.state(lesson) == "in progress"


def test_progress_write_is_atomic(sandbox, monkeypatch):
    lesson = catalog.resolve("01")
    progress.update(lesson, state="in progress")
    before = open(progress.progress_path()).read()

    def crash(src, dst):
        raise OSError("disk full")
    with monkeypatch.context() as m:
        m.setattr(os, "replace", crash)  # the rename of common/report.py atomic_write
        with pytest.raises(OSError):
            progress.update(lesson, state="passed")
    path = progress.progress_path()
    assert open(path).read() == before  # the old file, whole
    left = set(os.listdir(os.path.dirname(path))) - {os.path.basename(path) + ".lock"}
    assert left == {os.path.basename(path)}  # no temp file left behind


def test_damaged_progress_is_kept_aside_with_a_warning(sandbox, capsys):
    lesson = catalog.resolve("01")
    path = progress.progress_path()
    os.makedirs(os.path.dirname(path))
    for n, damage in enumerate(['{"01_sum": {"state": "passed", "hints": 2', '["not", "a table"]'], 1):
        with open(path, "w") as f:
            f.write(damage)
        assert progress.load_progress() == {}  # a fresh start, not a crash ...
        warning = capsys.readouterr().err
        aside = path + ".damaged" + ("" if n == 1 else str(n))
        assert "is damaged" in warning and os.path.basename(aside) in warning, warning
        assert open(aside).read() == damage  # ... and the damaged file kept, never overwritten
        assert not os.path.exists(path)
    progress.update(lesson, state="in progress")  # carries on
    assert practice.state(lesson) == "in progress" and capsys.readouterr().err == ""


def _hint_many_times(times):
    lesson = catalog.resolve("01")
    for _ in range(times):
        practice.next_hint(lesson)


def test_progress_updates_are_atomic_under_a_lock(sandbox, monkeypatch):
    """Several `hint` commands at once: each one counts (a read-modify-write without a lock loses some)."""
    import multiprocessing
    lessons = sandbox / "lessons"
    lessons.mkdir()
    (lessons / "01_sum.py").write_text(open(os.path.join(PRACTICE_FIXTURES, "01_sum.py")).read())
    yaml_text = open(os.path.join(PRACTICE_FIXTURES, "01_sum.yaml")).read()
    hints = ", ".join(f'"hint {i}"' for i in range(100))
    (lessons / "01_sum.yaml").write_text(yaml_text.split("hint:")[0] + f"hint: [{hints}]\n")
    monkeypatch.setenv("TUTOR_LESSONS", str(lessons))
    procs, each = 4, 20
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_hint_many_times, args=(each,)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * procs
    assert progress.load_progress()["01_sum"]["hints"] == procs * each


def test_start_over_twice_keeps_every_earlier_copy(sandbox):
    lesson = catalog.resolve("01")
    path, _, _ = practice.write_copy(lesson)
    with open(path, "a") as f:
        f.write("# solved\n")
    _, _, first = practice.write_copy(lesson, force=True)
    _, _, second = practice.write_copy(lesson, force=True)  # the copy is the fresh stub: nothing to keep
    assert second is None and open(first).read().endswith("# solved\n")
    with open(path, "a") as f:
        f.write("# second try\n")
    _, _, third = practice.write_copy(lesson, force=True)
    assert third == path + ".bak2" and open(third).read().endswith("# second try\n")
    assert open(first).read().endswith("# solved\n")


def test_hints_come_one_at_a_time_and_are_remembered(sandbox):
    lesson = catalog.resolve("01")
    assert practice.next_hint(lesson) == (["use an all-reduce"], 2)
    assert practice.next_hint(lesson)[0] == ["use an all-reduce", "comm.allreduce(rank + 1, op=MPI.SUM)"]
    assert len(practice.next_hint(lesson)[0]) == 2  # stays at all of them
    assert json.load(open(progress.progress_path()))["01_sum"]["hints"] == 2


def test_hints_start_from_the_check_that_failed_and_a_new_failure_starts_again(sandbox, tmp_path, monkeypatch):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    (lessons / "01_sum.py").write_text(open(os.path.join(PRACTICE_FIXTURES, "01_sum.py")).read())
    yaml_text = open(os.path.join(PRACTICE_FIXTURES, "01_sum.yaml")).read().split("hint:")[0]
    (lessons / "01_sum.yaml").write_text(yaml_text + 'hint: ["chunks go right", "count the steps", "no deadlock"]\n')
    monkeypatch.setenv("TUTOR_LESSONS", str(lessons))
    lesson = catalog.resolve("01")
    assert practice.closest_first(["a b", "steps counted twice", "x"], "the ring takes 2 steps") == [1, 0, 2]
    out = supervise.Outcome(rc=0, seconds=0.1, errors={})
    out.results = {"np": 2, "ranks": [{"rank": 0, "sum": 1}, {"rank": 1, "sum": 1}]}
    practice.remember_failure(lesson, [(lesson, 2, "mpi4py", out, "fail", ["check failed: ..."])])
    assert practice.last_failure(lesson) == {"where": "np=2 api=mpi4py", "what": ["sum of rank+1 is N(N+1)/2"]}
    timeout = [(lesson, 1, "mpi4py", None, "timeout", ["TIMEOUT: every rank waits", "a deadlock"])]
    practice.remember_failure(lesson, timeout)
    assert practice.next_hint(lesson) == (["no deadlock"], 3)  # closest to what failed
    assert practice.next_hint(lesson) == (["no deadlock", "chunks go right"], 3)
    practice.remember_failure(lesson, timeout[:0] + [(lesson, 1, "mpi4py", None, "crash", ["count steps"])])
    assert practice.next_hint(lesson) == (["count the steps"], 3)  # a new failure starts again
    practice.remember_failure(lesson, [(lesson, 1, "mpi4py", out, "pass", [])])
    assert practice.last_failure(lesson) is None and len(practice.next_hint(lesson)[0]) == 2


def test_after_a_run_the_takeaway_or_the_view_that_shows_the_failure(sandbox):
    lesson = catalog.resolve("01")
    lesson.meta = {**lesson.meta, "takeaway": ["one", "two"], "view": {"args": ["--trace"], "says": "the board"}}
    assert practice.after_run(lesson, "pass", 2, "mpi4py", "cpu", False, []) == ["take away:", "  - one", "  - two"]
    assert practice.run_mark(lesson) == "✓"
    assert practice.after_run(lesson, "fail", 3, "torch", "cpu", True, []) == [
        "to see it: bin/tutor run 01 --mine -n 3 --api torch -- --trace", "  (the board)"]
    assert practice.run_mark(lesson) == "✓"  # a run of your copy is not a run of the lesson
    assert practice.after_run(lesson, "fail", 3, "mpi4py", "cpu", False, ["--trace"]) == []  # it was that view
    assert practice.after_run(lesson, "timeout", 3, "mpi4py", "cpu", False, []) == []
    assert practice.run_mark(lesson) == "✗ timeout"
    cases = [(lesson, 1, "mpi4py", None, "pass", []), (lesson, 2, "torch", None, "fail", []),
             (lesson, 3, "mpi4py", None, "fail", [])]
    assert practice.see_failures(cases, {}, mine=False) == [
        "to see it: bin/tutor run 01 -n 2 --api torch -- --trace", "  (the board)"]


def test_a_pass_counts_only_what_was_graded(sandbox):
    lesson = catalog.resolve("01")
    half = practice_grading.Splice("p.py", "l.py", "", mine=["allreduce"], reference=["other"])
    assert "next, write exercise other" in practice.record(lesson, ["pass", "pass"], half, full=True)
    yours = practice_grading.Splice("p.py", "l.py", "", mine=["allreduce"])
    assert "nothing was graded" in practice.record(lesson, ["not graded", "blocked"], yours, full=True)
    assert "not yet" in practice.record(lesson, ["pass", "not run"], yours, full=True)
    assert practice.state(lesson) == "in progress"


def test_solution_waits_for_a_full_pass(sandbox):
    lesson = catalog.resolve("01")
    assert practice.state(lesson) == "not started"
    with pytest.raises(exercise.PracticeError, match="solve it first"):
        practice.solution(lesson)
    assert "op=MPI.SUM" in practice.solution(lesson, force=True)
    yours = practice_grading.Splice("p.py", "l.py", "", mine=["allreduce"])
    practice.record(lesson, ["pass"], yours, full=False)  # one NP only: not yet
    assert practice.state(lesson) == "in progress"
    practice.record(lesson, ["pass", "not graded"], yours, full=True)
    assert practice.state(lesson) == "passed"
    assert "value = ctx.comm.allreduce(ctx.rank + 1, op=MPI.SUM)" in practice.solution(lesson)


def test_unfinished_names_the_exercise_and_where(sandbox):
    lesson = catalog.resolve("01")
    path, _, _ = practice.write_copy(lesson)
    out = supervise.Outcome(rc=1, seconds=0.1, errors={
        0: f"NotImplementedError: exercise allreduce: not done yet ({path_shown(path)}:13)"})
    lines = exercise.explain_for_learner(lesson, out, None, path, verdict.explain(lesson, out, None))
    assert lines == [f"exercise 'allreduce' is not done yet: replace the TODO and the `raise "
                     f"NotImplementedError` at {path_shown(path)}:12-13 with your code"]


# ---- the whole loop, as a learner types it -----------------------------------------------------

def test_practice_check_fix_pass_list(sandbox):
    env = dict(os.environ)
    first = tutor("practice", "01", env=env)
    assert first.returncode == 0 and "exercise allreduce" in first.stdout, first.stderr
    assert tutor("practice", "01", env=env).returncode == 2
    stub = tutor("check", "01", "--mine", env=env)  # nothing written yet: found before any launch
    assert stub.returncode == 1 and "checking" not in stub.stdout + stub.stderr, stub.stdout
    assert "nothing to check yet" in stub.stderr and "01_sum.py:12" in stub.stderr, stub.stderr
    assert "in progress" in tutor("list", env=env).stdout
    assert tutor("solution", "01", env=env).returncode == 2
    path = os.path.join(sandbox, "practice", "01_sum.py")
    mine = open(path).read()
    wrong = mine.replace('raise NotImplementedError("exercise allreduce: not done yet")',
                         "value = ctx.comm.allreduce(ctx.rank, op=MPI.SUM)")
    open(path, "w").write(wrong)
    off = tutor("check", "01", "--mine", env=env)
    assert off.returncode == 1 and 'check failed: "sum of rank+1 is N(N+1)/2"' in off.stderr, off.stderr
    assert "to see it: bin/tutor run 01 --mine -n 1\n" in off.stderr, off.stderr  # its first failed run
    hinted = tutor("hint", "01", env=env).stdout  # starts from the check that failed
    assert hinted.startswith("your last `check 01 --mine` failed (np=1 api=mpi4py): sum of rank+1"), hinted
    ran = tutor("run", "01", "--mine", "-n", "2", env=env)  # the copy, with the lesson's flags if any
    assert ran.returncode == 1 and "your copy" in ran.stdout and "sum of rank+1" in ran.stderr, ran.stderr
    open(path, "w").write(wrong.replace("ctx.rank, op", "ctx.rank + 1, op"))
    good = tutor("check", "01", "--mine", env=env)
    assert good.returncode == 0 and "passes every check" in good.stdout, good.stdout + good.stderr
    listed = tutor("list", env=env).stdout.splitlines()
    assert len(listed) == 2 + len(catalog.lessons()) + 1 and "✓ passed" in listed[2], listed  # a line each
    assert tutor("hint", "01", env=env).stdout.startswith("✓ you passed 01_sum: `bin/tutor solution 01`")
    assert "op=MPI.SUM" in tutor("solution", "01", env=env).stdout


def test_syntax_error_in_the_copy_is_named_with_file_and_line(sandbox):
    env = dict(os.environ)
    assert tutor("practice", "01", env=env).returncode == 0
    path = os.path.join(sandbox, "practice", "01_sum.py")
    lines = open(path).read().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "raise NotImplementedError" in line)
    lines[at] = lines[at].replace('raise NotImplementedError("exercise allreduce: not done yet")',
                                  "value = ctx.comm.allreduce(ctx.rank + 1 op=MPI.SUM)")
    open(path, "w").writelines(lines)
    proc = tutor("check", "01", "--mine", env=env)
    assert proc.returncode == verdict.EXIT["crash"] and "Traceback" not in proc.stderr, proc.stderr
    said = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(said) == 1 and f"01_sum.py:{at + 1}: SyntaxError: " in said[0], proc.stderr
    assert "ctx.rank + 1 op=MPI.SUM" in said[0]


def test_a_deadlocking_answer_says_it_waits_and_stops_after_one_hang(sandbox, monkeypatch):
    lessons = sandbox / "lessons"
    lessons.mkdir()
    (lessons / "01_sum.py").write_text(open(os.path.join(PRACTICE_FIXTURES, "01_sum.py")).read())
    yaml_text = open(os.path.join(PRACTICE_FIXTURES, "01_sum.yaml")).read()
    (lessons / "01_sum.yaml").write_text(yaml_text.replace("timeout_s: 30", "timeout_s: 3"))
    env = {**os.environ, "TUTOR_LESSONS": str(lessons)}
    assert tutor("practice", "01", env=env).returncode == 0
    path = os.path.join(sandbox, "practice", "01_sum.py")
    mine = open(path).read().replace('raise NotImplementedError("exercise allreduce: not done yet")',
                                     "value = ctx.comm.recv(source=(ctx.rank + 1) % ctx.world_size)")
    open(path, "w").write(mine)  # every rank waits for a message no one sends
    start = time.monotonic()
    proc = tutor("check", "01", "--mine", env=env, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "01_sum np=1 mpi4py: still running after" in proc.stderr, proc.stderr
    assert "TIMEOUT" in proc.stderr and "not run" in proc.stdout and "1 not run" in proc.stdout
    assert "once np=1 mpi4py hung" in proc.stderr
    assert took < 2 * 3 + 4, f"it waited out the second NP too ({took:.1f} s)"


# ---- the answer-key proof ----------------------------------------------------------------------

def answer_key(lesson, np, stub_path, with_reference=False, only=None):
    """Why the stub (every region, or only the one named) did not pass (None if it passed) and, with
    _reference, why the lesson itself did not. mpi4py, CPU, the YAML's args: the same run
    tests/test_lessons.py makes of the lesson at every check NP, so the proof leaves the reference to it."""
    with open(lesson.path) as f:
        source = f.read()
    with open(stub_path, "w") as f:
        f.write(exercise.make_stub(source, lesson.id, only=only))
    api = "mpi4py" if "mpi4py" in lesson.meta["apis"] else lesson.meta["apis"][0]
    reasons = []
    for script in (stub_path, None) if with_reference else (stub_path,):
        outcome, checks = lesson_run.run_lesson(lesson, np, api, "cpu", lesson.meta.get("args", []),
                                            echo=False, script=script)
        why = exercise.explain_for_learner(lesson, outcome, checks, script or lesson.path,
                               verdict.explain(lesson, outcome, checks))
        reasons.append(None if verdict.ok(outcome, checks) else "; ".join(why) or f"exit {outcome.rc}")
    return reasons


def test_answer_key_catches_a_stub_that_passes_by_accident(sandbox):
    lesson = catalog.resolve("02")
    stub_reason, ref_reason = answer_key(lesson, 2, os.path.join(sandbox, "02_swallow.py"), True)
    assert stub_reason is None and ref_reason is None  # the proof below would flag this lesson
    stub_reason, ref_reason = answer_key(catalog.resolve("01"), 2, os.path.join(sandbox, "01_sum.py"), True)
    assert "exercise 'allreduce' is not done yet" in stub_reason and ref_reason is None


def _region_cases():
    folder = os.path.join(ROOT, "lessons")
    cases = []
    for lesson in catalog.lessons(folder):
        with open(lesson.path) as f:
            regions = exercise.find_regions(f.read(), lesson.path)
        if not regions:
            continue
        try:
            lesson = catalog.resolve(lesson.name, folder)
        except catalog.CatalogError as exc:
            cases.append(pytest.param(lesson, "", marks=pytest.mark.skip(reason=str(exc)), id=lesson.name))
            continue
        marks = [pytest.mark.skip(reason="needs a GPU")] if lesson.needs_gpu else []
        marks += torch_marks(lesson.name, "mpi4py")
        cases += [pytest.param(lesson, r.name, marks=marks, id=f"{lesson.name}-{r.name}") for r in regions]
    return cases


@pytest.mark.parametrize("lesson, region", _region_cases())
def test_answer_key_every_region_is_guarded(lesson, region, tmp_path, monkeypatch, capsys):
    """With only this region stubbed, some check NP must fail (smallest NP first: fewest ranks to start).
    A region no check run reaches would let a learner 'pass' without writing it."""
    monkeypatch.setenv("PYTHONPATH", ROOT)  # the stub lives in tmp_path, away from common/
    monkeypatch.delenv("TUTOR_LESSONS", raising=False)
    tried = []
    for np in sorted(lesson.meta["np"]["check"]):
        (reason,) = answer_key(lesson, np, str(tmp_path / os.path.basename(lesson.path)), only=region)
        tried.append(np)
        if reason:
            with capsys.disabled():
                shown = reason.replace(path_shown(str(tmp_path)) + os.sep, "")
                print(f"\n  answer key {lesson.name} [{region}] np={np}: stub fails: {shown}", end="")
            return
    pytest.fail(f"{lesson.name}: with exercise {region!r} stubbed, every check run passed (np {tried}): no "
                "check run reaches it, or an except swallows NotImplementedError")


def test_paths_are_shown_the_shorter_way(tmp_path, monkeypatch):
    """A practice folder outside the repo is named absolutely once '../' steps would make it longer,
    so that CI's deeper checkout does not push 'Edit <copy>;' past 100 columns (it did: 101)."""
    deep = tmp_path / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    outside = "/tmp/x.py"
    assert os.path.relpath(outside).startswith("../") and path_shown(outside) == outside
    assert path_shown(str(deep / "03.py")) == "03.py"


# ---- bin/tutor doctor's last word: what this machine is ready for --------------------------------

@pytest.mark.parametrize("mpi_ok, torch_ok, gpu, n, said", [
    (True, True, {"mpi4py": (False, "no NVIDIA GPU found"), "torch": (False, "no NVIDIA GPU found")}, 0,
     ["yes: MPI on NumPy buffers, every lesson", "yes: torch.distributed with gloo",
      "no: no GPU visible (above)", "no: no GPU visible (above)"]),
    (True, False, {"mpi4py": (True, "ok"), "torch": (False, "torch has no CUDA")}, 2,
     ["yes: MPI on NumPy buffers, every lesson but 08 (its model is torch)",
      "no: torch with gloo does not import (the torch section says why)",
      "yes: up to 2 rank(s) per node, one GPU each", "no: torch has no CUDA"]),
    (False, True, {"mpi4py": (True, "ok"), "torch": (True, "ok")}, 1, ["no: MPI does not launch one world"] * 4),
])
def test_doctor_ends_with_one_line_per_api_and_device(capsys, mpi_ok, torch_ok, gpu, n, said):
    from common.runner import doctor
    doctor.ready_section(mpi_ok, torch_ok, gpu, n)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "this machine is ready for" and len(out) == 5, out
    rows = [line.split(None, 4)[4] for line in out[1:]]  # "  mpi4py on the cpu  yes: ..."
    assert [r[:len(s)] for r, s in zip(rows, said)] == said and max(map(len, out)) <= 100, out
