"""Lesson 14's planted faults, each at NP 3 and 4 on a random rank, on both APIs: the runner's diagnosis
names the rank, the call and the field within the run's limit plus 5 s; a straggler passes and is
named. That a run with nothing wrong carries no diagnosis (no false report) is checked on every lesson's
real runs, in tests/test_lessons.py."""
import inspect
import json
import random
import textwrap

import pytest

from common.runner import catalog, engine
from conftest import load_lesson, torch_marks, tutor
from lessons.hung_job import reading, show

FAULTS = ("skip", "op", "count", "dtype", "root", "subgroup", "p2p-cycle", "straggler")
LIMIT = 20  # seconds: a planted hang ends once stuck for ~1 s, far sooner


def lesson():
    return catalog.resolve("14")


def clean_entries(page):
    """A clean job's world collectives as the recorder keeps them (sites as on the page: one line each)."""
    return [{"kind": "coll", "comm": "world", "seq": step * page.PER_STEP + i + 1, "op": op, "dtype": dtype,
             "count": count, "root": root, "site": site}
            for step in range(page.STEPS)
            for i, (op, dtype, count, root, site) in enumerate((("all_reduce", "float32", 1024, -1, "p.py:174"),
                                                                ("all_reduce", "float64", 1, -1, "p.py:180"),
                                                                ("broadcast", "float32", 1024, 0, "p.py:185")))]


@pytest.mark.parametrize("world", [3, 4, 5])
def test_each_fault_planted_on_paper_is_read_where_it_was_planted(world):
    """No MPI: the page's first_divergence on a clean job's records, and on each fault reading.py plants
    on rank 0, a middle rank and the last rank, names the planted rank, #k and field; the clean records,
    nothing."""
    page = load_lesson("14_hung_job.py")
    clean, cases = reading.grade(page.first_divergence, clean_entries(page), world, page.planted_seq)
    assert clean == "none"
    on = sorted({0, world // 2, world - 1})
    assert [c["planted_on"] for c in cases] == [R for R in on for _ in reading.ON_PAPER]
    assert [(c["rank"], c["seq"], c["field"]) for c in cases] == \
        [(R, 9 if f == "root" else 7, f) for R in on for f in reading.ON_PAPER], cases


def test_a_plant_changes_what_the_real_fault_changes():
    """What real runs' rankR.flight files held (--fault F --fault-rank 2, NP 3, MPICH and gloo): a hang
    ends every record at #7; the skipping rank's #7 is its next call, from that call's line; op, count
    and dtype come from the fault's own line, which no other call has; root keeps the line, and its run
    (finished by luck on MPICH) goes on."""
    page = load_lesson("14_hung_job.py")
    template = reading.calls(clean_entries(page))
    sites = {c.site for c in template}
    for fault in reading.ON_PAPER:
        k = page.planted_seq(fault)
        plant = reading.planted(template, 3, 2, fault, k)
        mine, other = plant[2], plant[0]
        assert [c.seq for c in mine] == [c.seq for c in other], fault  # numbered alike, none missing
        assert other == (template[:k] if fault in reading.HANGS else template), fault
        assert mine[:k - 1] == template[:k - 1], fault
        if fault == "skip":
            assert mine[-1] == template[k]._replace(seq=k)
        elif fault == "root":
            assert mine[k - 1] == template[k - 1]._replace(root=1) and mine[k:] == template[k:]
        else:
            assert mine[-1].site not in sites and len(mine) == k, (fault, mine[-1])


def test_the_readings_the_old_plants_passed_now_fail():
    """Two readings that passed when every fault sat on rank 1 and kept its call's line: "the first
    rank that differs from rank 0" and "skip whenever the line differs" (tests/wrong_answers has them
    as a learner writes them; here the paper grading alone, no MPI)."""
    page = load_lesson("14_hung_job.py")
    source = inspect.getsource(page.first_divergence)
    wrong = {"rank 0 is right": ("if call != usual)", "if call != here[0])"),
             "another line is a skip": ("(mine.site != usual.site and mine.site in elsewhere)",
                                        "mine.site != usual.site")}
    for name, (old, new) in wrong.items():
        assert old in source, name
        space = dict(vars(page))
        exec(textwrap.dedent(source.replace(old, new)), space)
        _, cases = reading.grade(space["first_divergence"], clean_entries(page), 3, page.planted_seq)
        missed = [c for c in cases if (c["rank"], c["seq"], c["field"]) != (c["want_rank"], c["want_seq"],
                                                                            c["want_field"])]
        assert missed, f"{name} passes the paper grading"


@pytest.mark.parametrize("secs, noise, verdict", [
    ({"bare": 3e-6, "recorded": 6e-6, "record": 3e-6}, {"bare": 1e-6, "recorded": 1e-6, "record": 0}, "more"),
    ({"bare": 3e-6, "recorded": 6e-6, "record": 3e-6}, {"bare": 1e-6, "recorded": 4e-6, "record": 0}, "noise"),
    ({"bare": 9e-6, "recorded": 6e-6, "record": 3e-6}, {"bare": 1e-6, "recorded": 1e-6, "record": 0}, "less")])
def test_what_recording_costs_is_said_only_beyond_the_noise(secs, noise, verdict, capsys):
    """"costs more" only when recorded - bare exceeds the larger of the two's batch spreads; within it,
    the line says so; every line within 100 columns."""
    assert show.cost_verdict(secs, noise) == verdict
    for checked in (False, True):  # --debug-collectives: the recorded call is checked too
        show.cost({k: v * 1000 for k, v in secs.items()}, {k: v * 1000 for k, v in noise.items()}, verdict, checked)
        show.cost(secs, noise, verdict, checked)
        said = capsys.readouterr().out
        assert ("costs 3.0 us more" in said) == (verdict == "more") and ("within" in said) == (verdict == "noise")
        assert "noise" in said and all(len(line) <= 100 for line in said.splitlines()), said


def test_a_fault_that_did_not_stop_the_run_is_said_to_have_passed_by_luck(capsys):
    page = load_lesson("14_hung_job.py")
    entries = [{**e, "peers": "", "state": "completed"} for e in clean_entries(page)]
    show.record(entries, lucky=True)
    said = capsys.readouterr().out
    assert "by luck" in said and all(len(line) <= 100 for line in said.splitlines()), said
    show.record(entries)
    assert "luck" not in capsys.readouterr().out


@pytest.mark.parametrize("api", [pytest.param(a, marks=torch_marks("14_hung_job", a)) for a in ("mpi4py", "torch")])
@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_named(fault, n, api):
    R = random.randrange(n)
    les = lesson()
    outcome, checks = engine.run_lesson(les, n, api, "cpu", ["--fault", fault, "--fault-rank", str(R)],
                                        echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + engine.explain(les, outcome, checks))
    where = f"--fault {fault} --fault-rank {R}, np {n}, {api}"
    assert engine.status(outcome, checks) == "pass", f"{where}: {checks}\n{said}"
    assert outcome.seconds <= LIMIT + 5, f"{where}: took {outcome.seconds:.1f} s"
    graded = {c["name"] for c in checks}
    if fault == "straggler":
        assert outcome.results["summary"]["slowest_rank"] == R and not outcome.timed_out, said
        assert outcome.diagnosis is None, f"a straggler's run is not a hang: {outcome.diagnosis}"
        return
    d = outcome.diagnosis
    assert d and any("diagnosis" in name for name in graded), said
    if fault == "p2p-cycle":
        assert R in d["ranks"] and d["field"] == "p2p-cycle", d
    else:
        assert (d["rank"], d["seq"], d["field"]) == (R, 9 if fault == "root" else 7,
                                                     {"subgroup": "comm"}.get(fault, fault)), d
    assert f"rank {R}" in said, said  # the learner is told, not only the JSON


@pytest.mark.parametrize("fault, field", [("subgroup", "comm"), ("p2p-cycle", "p2p-cycle")])
def test_on_the_gpu_double_a_call_is_enqueued_not_completed(fault, field, tmp_path, monkeypatch):
    """CuPy + NCCL under the GPU double: a NCCL call returns once queued, so the ranks' records say
    `enqueued` (torch's recorder would say scheduled, or started with TORCH_NCCL_ENABLE_TIMING=1) for
    the call the GPU still waits in, and the diagnosis is the same as on the CPU."""
    from gpu_double import env
    for key, value in env(str(tmp_path)).items():
        monkeypatch.setenv(key, value)
    R = random.randrange(3)
    les = lesson()
    outcome, checks = engine.run_lesson(les, 3, "mpi4py", "gpu", ["--fault", fault, "--fault-rank", str(R)],
                                        echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + engine.explain(les, outcome, checks))
    assert engine.status(outcome, checks) == "pass" and outcome.results["device"] == "gpu", said
    d = outcome.diagnosis  # two faults that hang the double (a count fault may complete with garbage)
    assert d["field"] == field and R in d["ranks"] and d["state"] == "enqueued", d
    assert "enqueued" in said, said


@pytest.mark.parametrize("fault, api", [("skip", "mpi4py"), ("subgroup", "mpi4py"), ("root", "mpi4py"),
                                        pytest.param("count", "torch", marks=pytest.mark.torch)])
def test_debug_collectives_stops_at_the_first_mismatch(fault, api):
    """--debug-collectives: the ranks compare fingerprints before the call, so the run stops with
    CollectiveMismatch (within its 1.5 s wait) before the runner's 1 s stuck watch would end it, and the
    diagnosis is the same."""
    R = random.randrange(3)
    les = lesson()
    outcome, checks = engine.run_lesson(les, 3, api, "cpu", ["--fault", fault, "--fault-rank", str(R),
                                                              "--debug-collectives"], echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + engine.explain(les, outcome, checks))
    assert any("CollectiveMismatch" in e for e in outcome.errors.values()), said
    assert not outcome.timed_out and engine.status(outcome, checks) == "pass", said
    assert "--debug-collectives: world #" in said and outcome.diagnosis["rank"] == R, said


def test_the_results_json_keeps_the_diagnosis_and_why_says_it_again(tmp_path):
    state = {"TUTOR_STATE": str(tmp_path / "state")}
    first = tutor("why", env=state)
    assert first.returncode == 1 and "no run recorded yet" in first.stdout, first.stdout + first.stderr
    path = tmp_path / "r.json"
    ran = tutor("run", "14", "-n", "2", "--json", str(path), "--", "--fault", "count", "--fault-rank", "1",
                env=state)
    assert ran.returncode == 0 and "rank 1's #7 differs: count 512 vs 1024" in ran.stderr, ran.stdout + ran.stderr
    kept = json.loads(path.read_text())
    assert (kept["diagnosis"]["rank"], kept["diagnosis"]["field"], kept["status"]) == (1, "count", "pass")
    again = tutor("why", env=state)
    assert again.returncode == 0 and "rank 1's #7 differs: count 512 vs 1024" in again.stdout, again.stdout
    ours = ran.stderr.split("why, from the ranks' flight records:")[1] + again.stdout  # MPI's own lines are longer
    assert all(len(line) <= 100 for line in ours.splitlines()), ours
    clean = tutor("run", "00", "-n", "2", env=state)
    assert clean.returncode == 0 and "flight records" not in clean.stdout + clean.stderr
    assert "left nothing to diagnose" in tutor("why", env=state).stdout
