"""Tier 2: bin/tutor against fixture lessons that pass, report a wrong value, crash, hang, get killed.
Proves the checker can fail, and that a failed or hung run leaves nothing behind."""
import json
import os
import re
import sys

import pytest
from typer.testing import CliRunner

from common.plumbing import run_folder
from common.runner import catalog, checktable, lesson_run, supervise, verdict
from conftest import FIXTURES, ROOT, dollar_line, processes_running

# these tests look for the fixture lessons' processes by name: under pytest-xdist (make test) they
# share one worker, so one test never sees another's run of the same fixture as its own leftover
pytestmark = pytest.mark.xdist_group("fixture_processes")

runner = CliRunner()


def line_of(fixture, text):
    with open(os.path.join(FIXTURES, fixture)) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def test_passing_lesson(app, fixtures_env):
    result = runner.invoke(app, ["run", "1", "-n", "2"])
    assert result.exit_code == 0, result.output
    first = dollar_line(result.output)
    assert first.startswith("$ ") and "-n 2" in first and "-m mpi4py tests/fixtures/01_pass.py" in first
    assert "✓" in result.output and "PASS" in result.output


def test_results_json_of_the_contract(app, fixtures_env, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["run", "01_pass", "-n", "3", "--json", str(out), "--", "--count", "7"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert {"lesson", "np", "api", "device", "transport", "params", "ranks", "summary"} <= set(doc)
    assert doc["np"] == 3 and [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    assert doc["params"] == {"count": 7} and doc["transport"] == "mpi"


def test_wrong_value_fails_the_check(app, fixtures_env, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["run", "2", "--json", str(out)])
    assert result.exit_code == verdict.EXIT["fail"] == 1
    assert "✗" in result.output and "rank 1: 2" in result.output and "FAIL" in result.output
    doc = json.loads(out.read_text())
    assert doc["status"] == "fail" and doc["ok"] is False
    assert [(c["name"], c["got"], c["want"], c["ok"]) for c in doc["checks"]] == [
        ("each rank reports its rank squared", ["rank 1: 2, want 1"], "== [0, 1]", False)]
    assert doc["checks"][0]["rule"] == "== rank**2" and doc["checks"][0]["of"] == "2 ranks"
    assert doc["why"] == ["check failed: each rank reports its rank squared: got rank 1: 2, want 1; wanted == rank**2"]


def test_lesson_flag_makes_a_passing_lesson_fail(app, fixtures_env):
    result = runner.invoke(app, ["run", "1", "--", "--wrong"])
    assert result.exit_code == 1 and "check failed: sum of rank+1" in result.output


def test_crash_on_one_rank_names_it(app, fixtures_env, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["run", "3", "--json", str(out)])
    assert result.exit_code == verdict.EXIT["crash"] == 3
    doc = json.loads(out.read_text())
    assert doc["status"] == "crash" and doc["checks"] == [] and doc["why"][0].startswith("rank 1 failed")
    raise_line = line_of("03_crash.py", "raise ValueError")
    assert f"rank 1 failed: ValueError: rank 1 fails on purpose (tests/fixtures/03_crash.py:{raise_line})" \
        in result.output
    assert "before writing its results" in result.output
    assert "0 checks" not in result.output and "✓" not in result.output
    assert not processes_running("tests/fixtures/03_crash.py")


def test_rank_killed_by_a_signal_is_named(app, fixtures_env):
    result = runner.invoke(app, ["run", "5"])
    assert result.exit_code != 0
    # hydra kills rank 0 with the same SIGKILL; about one run in twenty its status says so, and then
    # the runner must say it cannot tell the two apart (tests/test_robust.py covers both cases).
    sure = re.search(r"rank 1 \(pid \d+\) was killed by signal 9 \(SIGKILL\); \S+ then ended", result.output)
    unsure = re.search(r"rank 0 \(pid \d+\) and rank 1 \(pid \d+\) were killed by signal 9 \(SIGKILL\): "
                       r"one of them died", result.output)
    assert sure or unsure, result.output
    assert "Exit codes" not in result.output, "hydra's status line is the runner's, not the learner's"
    assert not processes_running("tests/fixtures/05_killed.py")


def test_hang_is_ended_at_its_timeout_with_each_rank_located(app, fixtures_env, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["run", "4", "--timeout", "3", "--json", str(out)])
    assert result.exit_code == verdict.EXIT["timeout"] == 124
    assert json.loads(out.read_text())["status"] == "timeout"
    assert "TIMEOUT: 04_hang ran past its 3 s limit" in result.output
    recv, barrier = line_of("04_hang.py", "ctx.comm.Recv("), line_of("04_hang.py", "ctx.comm.Barrier()")
    assert f"rank 0: wait_forever() at tests/fixtures/04_hang.py:{recv}" in result.output
    assert f"rank 1: main() at tests/fixtures/04_hang.py:{barrier}" in result.output
    assert not processes_running("tests/fixtures/04_hang.py"), "a rank of the hung run is still alive"


def test_check_runs_every_np_and_writes_junit(app, fixtures_env, tmp_path):
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["check", "1", "2", "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    assert "2 passed, 1 failed" in result.output         # 01 at np 1 and 2 pass, 02 fails
    xml = junit.read_text()
    assert xml.count("<testcase") == 3 and 'failures="1"' in xml and "02_wrong" in xml
    assert_fits(result.output)


def test_check_lists_what_this_machine_cannot_run_as_blocked(app, fixtures_env, tmp_path, monkeypatch):
    """A GPU case on a machine without one is neither a pass nor silently gone: a row, a count in the
    summary, a <skipped> that says why in JUnit, exit 4; nothing is launched."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["check", "1", "--device", "gpu", "--junit", str(junit)])
    assert result.exit_code == verdict.EXIT["blocked"] == 4, result.output
    assert result.output.count("– blocked") == 2 and "0 passed, 0 failed, 2 blocked" in result.output
    xml = junit.read_text()
    assert 'tests="2" failures="0" skipped="2"' in xml, xml
    assert xml.count('<skipped message="blocked: CUDA_VISIBLE_DEVICES hides every GPU; use --device cpu"') == 2, xml
    assert_fits(result.output)


def assert_fits(output, width=100):
    wide = [line for line in output.splitlines() if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}: {wide[0]!r}"


@pytest.mark.parametrize("outcome, checks, want", [
    (supervise.Outcome(rc=0, seconds=1), [{"ok": True}], "pass"),
    (supervise.Outcome(rc=1, seconds=1), [{"ok": False}], "crash"),                # results, then a failure
    (supervise.Outcome(rc=0, seconds=1), [{"ok": False}], "fail"),
    (supervise.Outcome(rc=1, seconds=1, errors={1: "ValueError: x"}), None, "crash"),
    (supervise.Outcome(rc=0, seconds=1), None, "crash"),                     # exited 0, wrote no results
    (supervise.Outcome(rc=9, seconds=1, statuses=[0, 9]), [{"ok": True}], "crash"),  # results, then killed
    (supervise.Outcome(rc=2, seconds=1, statuses=[512, 512]), None, "usage"),   # the lesson refused a flag
    (supervise.Outcome(rc=124, seconds=1, timed_out=True), None, "timeout"),
])
def test_each_outcome_has_one_status_and_its_exit_code(outcome, checks, want):
    assert verdict.status(outcome, checks) == want
    assert verdict.exit_code(outcome, checks) == verdict.EXIT[want]
    assert (verdict.exit_code(outcome, checks) == 0) == verdict.ok(outcome, checks)


def test_interrupted_exits_128_plus_the_signal():
    out = supervise.Outcome(rc=130, seconds=1, interrupted=True, signal=2)
    assert verdict.status(out, None) == "interrupted" and verdict.exit_code(out, None) == 130
    gone = supervise.Outcome(rc=137, seconds=1, launcher=(99, 9))  # mpiexec itself killed
    assert verdict.status(gone, None) == "crash" and verdict.exit_code(gone, None) == 137


def test_exit_codes_are_distinct_and_in_the_readme():
    assert len(set(verdict.EXIT.values())) == len(verdict.EXIT)
    readme = open(os.path.join(ROOT, "README.md")).read()
    for name, code in verdict.EXIT.items():
        assert re.search(rf"\| `{code}` \| `{name}` \|", readme), f"README lacks exit {code} ({name})"


def test_the_same_failure_on_every_rank_is_said_once():
    same = "AssertionError: wrong sum (lessons/x.py:9)"
    out = supervise.Outcome(rc=1, seconds=1, errors={0: same, 1: same, 2: "ValueError: odd (lessons/x.py:3)", 3: same})
    assert verdict.explain(None, out, None)[:2] == [f"ranks 0-1, 3 failed: {same}",
                                                   "rank 2 failed: ValueError: odd (lessons/x.py:3)"]


def column(table, i):
    """Column i of a table read back (the rule under its header gives the columns), its wrapped lines
    joined with single spaces."""
    lines = table.splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    return " ".join(" ".join(line[slice(*spans[i])] for line in lines[2:]).split())


def assert_whole_names(table, checks):
    """Every name whole, in order, however it was wrapped; no line over 100 columns."""
    assert column(table, 0).replace(" ", "") == "".join(c["name"] for c in checks).replace(" ", ""), table
    assert "…" not in table, table
    assert_fits(table)


def test_checks_table_keeps_names_whole_and_says_what_values_stand_for():
    sizes = [23, 39, 27, 18] * 5
    checks = [
        {"name": "each rank holds the whole list of every rank's twenty chunk offsets, in order, in the "
                 "lowest destination", "got": [f"rank {r}: {r * 0.1}" for r in range(20)],
         "want": "== [" + ", ".join(map(str, range(20))) + "]", "ok": False},
        {"name": "each rank holds the whole list of every rank's twenty chunk offsets, in order, in the "
                 "highest destination", "got": sizes, "want": f"== {sizes}", "ok": True, "of": "4 ranks x 5 counts",
         "rule": "== itemsize*2*(count-(count+np-1)//np)+2*count*itemsize"},
        {"name": "short", "got": 1, "want": "== 1", "ok": True},
        {"name": "bound", "got": [0.5, 0.25, 0.125], "want": "<= 0.75", "ok": True, "of": "3 sizes"},
        {"name": "sentinel", "got": ["rank 1 count 7: none, want 2"], "want": "== [-1, 2]", "ok": False,
         "rule": "== (rank+1)%np if count > 0 else -1", "none": -1},
        {"name": "no one", "got": -1, "want": "== -1", "ok": True, "none": -1},
        {"name": "forward bytes: (1) s T ((F - f[r+1]) + (H - h[r+1])); (2) s H (2T - t[r] - t[r+1])",
         "got": [r / 3 for r in range(20)], "want": "== [1.5, 2.25, 3.125] (rtol 1e-12, atol 1e-15)", "ok": True,
         "rule": "== " + "+".join(["alpha_us*np*size"] * 8) + " (rtol 1e-12, atol 1e-15)"}]
    text = checktable.checks_table(checks)
    assert_whole_names(text, checks)
    got, want = column(text, 1), column(text, 2)
    assert "rank 0: 0.0; rank 1: 0.1;" in got and "13 more" in got, text  # a failure's items, how many more
    assert "each of 4 ranks x 5 counts" in got and "max 0.5 of 3 sizes" in got, text
    assert "rank 1 count 7: none, want 2" in got and "== none" in want, text  # the sentinel as its word
    assert "== the YAML's formula (rtol 1e-12, atol 1e-15)" in want, text  # a formula too long to read here
    assert "== (rank+1)%np if count > 0 else -1" in want, text  # a short one as it is
    assert "==itemsize*2*(count-(count+np-1)//np)+2*count*itemsize" in want.replace(" ", ""), text  # split
    # after its operators, never cut


def test_list_and_hint_fit_a_terminal(app, tmp_path, monkeypatch):
    """The real lessons' titles and hints, which are long: wrapped, nothing cut."""
    monkeypatch.setenv("TUTOR_STATE", str(tmp_path))
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0
    assert_fits(listed.output)
    lines = listed.output.splitlines()
    for lesson in catalog.lessons():  # one line each: its id and name, whole
        assert sum(line.startswith(f"{lesson.id}  {lesson.name[3:]} ") for line in lines) == 1, lesson.name
    for _ in range(6):
        hinted = runner.invoke(app, ["hint", "04"])
    assert hinted.exit_code == 0 and hinted.output.count("hint ") >= 2
    assert_fits(hinted.output)


def test_list_and_hint(app, fixtures_env):
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0 and any(line.startswith("01  pass ") for line in result.output.splitlines())
    assert "first hint" in runner.invoke(app, ["hint", "1"]).output


@pytest.mark.parametrize("mine", [None, "3"])
def test_each_rank_gets_one_blas_thread_unless_the_learner_set_it(tmp_path, monkeypatch, mine):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if mine:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", mine)
    else:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    seen = tmp_path / "seen"
    script = f"import os; open({str(seen)!r}, 'w').write(os.environ['OPENBLAS_NUM_THREADS'] + ' ' + " \
             "os.environ['OMP_NUM_THREADS'])"
    outcome = supervise.supervise([sys.executable, "-c", script], 30, echo=False)
    assert outcome.rc == 0
    assert seen.read_text() == f"{mine or 1} 1"


def test_check_tally_says_the_counts_and_the_exit_status():
    """Failures or runs not made exit 1; otherwise anything blocked exits 4; all passed (or not graded) 0."""
    from common.runner import check_command
    how = check_command.CheckPlan()

    def cases(*verdicts):
        return [(None, 2, "mpi4py", None, v, []) for v in verdicts]
    assert check_command.tally(how, cases("pass", "not graded")) == ("1 passed, 0 failed, 1 not graded", 0)
    assert check_command.tally(how, cases("pass", "blocked")) == ("1 passed, 0 failed, 1 blocked", 4)
    assert check_command.tally(how, cases("timeout", "blocked", "not run")) == (
        "0 passed, 1 failed, 1 blocked, 1 not run", 1)
    assert check_command.tally(how, cases("pass", "not run"))[1] == 1
    assert check_command.tally(check_command.CheckPlan(unwritten=["05: nothing written"]), cases("pass"))[1] == 1


def test_the_still_running_line_tells_starting_and_working_from_stuck(tmp_path):
    """`check`'s line on a quiet run reads the ranks' flight records: starting while a rank has made no
    call, working while records move, and a deadlock question only once every rank has sat in a call
    with nothing moving, naming the calls. A phase is said once, the question each time."""
    from common import flight
    said = []
    wait = lesson_run.Waiting("05 np=2 torch", 90, said.append, 2)
    wait.watch(str(tmp_path))
    wait(5.0)
    assert "starting up (imports, joining the world): 0 of 2 ranks" in said[-1] and "deadlock" not in said[-1]
    wait(10.0)  # still starting: not said again
    assert said[-1].endswith("still running after 10 s of 90, as above"), said
    recs = [flight.Recorder(r, run_folder.rank_file(tmp_path, r, "flight")) for r in range(2)]
    slots = [rec.begin("all_reduce", "coll") for rec in recs]
    wait(20.0)  # the records just moved: both ranks are inside a call, but not for long
    assert "working" in said[-1] and "deadlock" not in said[-1], said
    wait(22.0)  # nothing moved since
    wait(40.0)
    assert "nothing moving for 20 s: ranks 0-1 wait in all_reduce #1" in said[-1], said
    assert said[-1].endswith("(a deadlock? Ctrl-C ends it)"), said
    recs[0].end(slots[0])  # rank 0 leaves its call: its record moved, so working again, no question
    wait(80.0)
    assert "working" in said[-1] and "deadlock" not in said[-1], said
    wait(81.0)
    wait(160.0)  # rank 0 outside any call, still: where each is, and no question
    assert "nothing moving for 80 s: rank 0 is in no recorded call" in said[-1], said
    assert "rank 1 waits in all_reduce #1" in said[-1] and "deadlock" not in said[-1], said
    assert [line.split(" after ")[1].split(" s")[0] for line in said] == ["5", "10", "20", "40", "80", "160"]


def test_the_shown_command_pastes_back_as_the_same_words():
    """A checkout whose path has a space: the `$ ...` line, pasted into a shell, is the command run."""
    import shlex
    cmd = ["/home/my tutor/.venv/bin/mpiexec", "-n", "2", "python", "/home/my tutor/lessons/00_hello.py"]
    line = lesson_run.shown(cmd)
    assert shlex.split(line.replace("\\\n", " ").lstrip("$ ")) == cmd, line
