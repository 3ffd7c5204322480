"""Tier 2: bin/tutor against fixture lessons that pass, report a wrong value, crash, hang, get killed.
Proves the checker can fail, and that a failed or hung run leaves nothing behind."""
import json
import os
import re
import sys

import pytest
from typer.testing import CliRunner

from common.runner import catalog, engine, launch
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
    assert result.exit_code == engine.EXIT["fail"] == 1
    assert "✗" in result.output and "rank 1: 2" in result.output and "FAIL" in result.output
    doc = json.loads(out.read_text())
    assert doc["status"] == "fail" and doc["ok"] is False
    assert [(c["name"], c["got"], c["want"], c["ok"]) for c in doc["checks"]] == [
        ("each rank reports its rank squared", ["rank 1: 2"], "== [0, 1]", False)]
    assert doc["why"] == ["check failed: each rank reports its rank squared: got rank 1: 2, want == [0, 1]"]


def test_lesson_flag_makes_a_passing_lesson_fail(app, fixtures_env):
    result = runner.invoke(app, ["run", "1", "--", "--wrong"])
    assert result.exit_code == 1 and "check failed: sum of rank+1" in result.output


def test_crash_on_one_rank_names_it(app, fixtures_env, tmp_path):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["run", "3", "--json", str(out)])
    assert result.exit_code == engine.EXIT["crash"] == 3
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
    assert result.exit_code == engine.EXIT["timeout"] == 124
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
    assert result.exit_code == engine.EXIT["blocked"] == 4, result.output
    assert result.output.count("– blocked") == 2 and "0 passed, 0 failed, 2 blocked" in result.output
    xml = junit.read_text()
    assert 'tests="2" failures="0" skipped="2"' in xml, xml
    assert xml.count('<skipped message="blocked: CUDA_VISIBLE_DEVICES hides every GPU; use --device cpu"') == 2, xml
    assert_fits(result.output)


def assert_fits(output, width=100):
    wide = [line for line in output.splitlines() if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}: {wide[0]!r}"


@pytest.mark.parametrize("outcome, checks, verdict", [
    (launch.Outcome(rc=0, seconds=1), [{"ok": True}], "pass"),
    (launch.Outcome(rc=1, seconds=1), [{"ok": False}], "crash"),                # results, then a failure
    (launch.Outcome(rc=0, seconds=1), [{"ok": False}], "fail"),
    (launch.Outcome(rc=1, seconds=1, errors={1: "ValueError: x"}), None, "crash"),
    (launch.Outcome(rc=0, seconds=1), None, "crash"),                     # exited 0, wrote no results
    (launch.Outcome(rc=9, seconds=1, statuses=[0, 9]), [{"ok": True}], "crash"),  # results, then killed
    (launch.Outcome(rc=2, seconds=1, statuses=[512, 512]), None, "usage"),   # the lesson refused a flag
    (launch.Outcome(rc=124, seconds=1, timed_out=True), None, "timeout"),
])
def test_each_outcome_has_one_status_and_its_exit_code(outcome, checks, verdict):
    assert engine.status(outcome, checks) == verdict
    assert engine.exit_code(outcome, checks) == engine.EXIT[verdict]
    assert (engine.exit_code(outcome, checks) == 0) == engine.ok(outcome, checks)


def test_interrupted_exits_128_plus_the_signal():
    out = launch.Outcome(rc=130, seconds=1, interrupted=True, signal=2)
    assert engine.status(out, None) == "interrupted" and engine.exit_code(out, None) == 130
    gone = launch.Outcome(rc=137, seconds=1, launcher=(99, 9))  # mpiexec itself killed
    assert engine.status(gone, None) == "crash" and engine.exit_code(gone, None) == 137


def test_exit_codes_are_distinct_and_in_the_readme():
    assert len(set(engine.EXIT.values())) == len(engine.EXIT)
    readme = open(os.path.join(ROOT, "README.md")).read()
    for verdict, code in engine.EXIT.items():
        assert re.search(rf"\| `{code}` \| `{verdict}` \|", readme), f"README lacks exit {code} ({verdict})"


def test_the_same_failure_on_every_rank_is_said_once():
    same = "AssertionError: wrong sum (lessons/x.py:9)"
    out = launch.Outcome(rc=1, seconds=1, errors={0: same, 1: same, 2: "ValueError: odd (lessons/x.py:3)", 3: same})
    assert engine.explain(None, out, None)[:2] == [f"ranks 0-1, 3 failed: {same}",
                                                   "rank 2 failed: ValueError: odd (lessons/x.py:3)"]


def test_checks_table_counts_long_lists_and_fits():
    checks = [{"name": "each rank holds the whole list of every rank's twenty chunk offsets, in order",
               "got": [f"rank {r}: {r * 0.1}" for r in range(20)], "want": "== [" + ", ".join(map(str, range(20))) + "]",
               "ok": False}, {"name": "short", "got": 1, "want": "== 1", "ok": True}]
    text = engine.checks_table(checks)
    assert_fits(text)
    assert "== [0, 1, … (20 values)]" in text and "rank 0: 0.0, … (20 values)" in text, text
    # lesson 10's shape: a long name beside two lists of 20 numbers, each cut with a '…' (3 bytes)
    sizes = [23, 39, 27, 18] * 5
    long = [{"name": "each rank holds ceil(items / N) of every layer, its share of the flat parameters",
             "got": sizes, "want": f"== {sizes}", "ok": True}]
    text = engine.checks_table(long)
    assert_fits(text)
    assert max(len(line.encode()) for line in text.splitlines()) <= 100, text  # tools that count bytes
    named = [{"name": "forward bytes: (1) s T ((F - f[r+1]) + (H - h[r+1])); (2) s H (2T - t[r] - t[r+1])",
              "got": sizes, "want": f"== {sizes}", "ok": True}]
    row = engine.checks_table(named).splitlines()[2]
    assert row.startswith("forward bytes: (1) s T ((F - f[r+") and row.count("…") == 3, row  # no '[… …'
    cut_twice = [{"name": "model: ring = 2(N-1)a + 2(N-1)/N nb, the two halves of the all-reduce",
                  "got": [r / 3 for r in range(20)], "want": "== [1.5, 2.25, 3.125] (rtol 1e-12, atol 1e-15)", "ok": True}]
    text = engine.checks_table(cut_twice)  # lesson 07's: its want cut twice, 4 '…' in one row
    assert max(len(line.encode()) for line in text.splitlines()) <= 100, text


def test_list_and_hint_fit_a_terminal(app, tmp_path, monkeypatch):
    """The real lessons' titles and hints, which are long: wrapped, nothing cut."""
    monkeypatch.setenv("TUTOR_STATE", str(tmp_path))
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0
    assert_fits(listed.output)
    words = " ".join(listed.output.split())
    for lesson in catalog.lessons():
        assert " ".join(catalog.load_yaml(lesson.yaml_path)["title"].split()) in words
    for _ in range(6):
        hinted = runner.invoke(app, ["hint", "04"])
    assert hinted.exit_code == 0 and hinted.output.count("hint ") >= 2
    assert_fits(hinted.output)


def test_list_and_hint(app, fixtures_env):
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0 and "01" in result.output and "fixture that passes" in result.output
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
    outcome = launch.run([sys.executable, "-c", script], 30, echo=False)
    assert outcome.rc == 0
    assert seen.read_text() == f"{mine or 1} 1"


def test_check_tally_says_the_counts_and_the_exit_status():
    """Failures or runs not made exit 1; otherwise anything blocked exits 4; all passed (or not graded) 0."""
    from common.runner import checking
    how = checking.Plan()

    def cases(*verdicts):
        return [(None, 2, "mpi4py", None, v, []) for v in verdicts]
    assert checking.tally(how, cases("pass", "not graded")) == ("1 passed, 0 failed, 1 not graded", 0)
    assert checking.tally(how, cases("pass", "blocked")) == ("1 passed, 0 failed, 1 blocked", 4)
    assert checking.tally(how, cases("timeout", "blocked", "not run")) == (
        "0 passed, 1 failed, 1 blocked, 1 not run", 1)
    assert checking.tally(how, cases("pass", "not run"))[1] == 1
    assert checking.tally(checking.Plan(unwritten=["05: nothing written"]), cases("pass"))[1] == 1
