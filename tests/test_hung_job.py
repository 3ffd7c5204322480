"""Lesson 14's planted faults, each at NP 3 and 4 on a random rank, on both APIs: the runner's diagnosis
names the rank, the call and the field within the run's limit plus 5 s; a straggler passes and is
named. That a run with nothing wrong carries no diagnosis (no false report) is checked on every lesson's
real runs, in tests/test_lessons.py."""
import json
import random

import pytest

from common.runner import catalog, engine
from conftest import load_lesson, torch_marks, tutor
from lessons.hung_job import reading

FAULTS = ("skip", "op", "count", "dtype", "root", "subgroup", "p2p-cycle", "straggler")
LIMIT = 20  # seconds: a planted hang ends once stuck for ~1 s, far sooner


def lesson():
    return catalog.resolve("14")


@pytest.mark.parametrize("world, R", [(3, 0), (4, 2), (5, 4)])
def test_each_fault_planted_on_paper_is_read_where_it_was_planted(world, R):
    """No MPI: the page's first_divergence on a clean job's records, and on each fault reading.py plants
    (on rank 0 and the last rank too), names the planted rank, #k and field; the clean records, nothing."""
    page = load_lesson("14_hung_job.py")
    entries = [{"kind": "coll", "comm": "world", "seq": step * page.PER_STEP + i + 1, "op": op, "dtype": dtype,
                "count": count, "root": root, "site": site}
               for step in range(page.STEPS)
               for i, (op, dtype, count, root, site) in enumerate((("all_reduce", "float32", 1024, -1, "p:1"),
                                                                   ("all_reduce", "float64", 1, -1, "p:2"),
                                                                   ("broadcast", "float32", 1024, 0, "p:3")))]
    clean, cases = reading.grade(page.first_divergence, entries, world, R, page.planted_seq)
    assert clean == "none"
    assert [(c["rank"], c["seq"], c["field"]) for c in cases] == \
        [(R, 9 if f == "root" else 7, f) for f in reading.ON_PAPER], cases


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
    `enqueued` (torch's flight recorder's word) for the call the GPU still waits in, and the diagnosis
    is the same as on the CPU."""
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
