"""Lesson 14's planted faults, each at NP 3 and 4 on a random rank, on both APIs: the runner's diagnosis
names the rank, the call and the field within the run's limit plus 5 s; a straggler passes and is
named. That a run with nothing wrong carries no diagnosis (no false report) is checked on every lesson's
real runs, in tests/test_lessons.py."""
import inspect
import json
import random
import textwrap

import pytest

from common.runner import catalog, lesson_run, verdict
from conftest import FIXTURES, load_lesson, torch_marks, tutor
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


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_each_fault_planted_on_paper_is_read_where_it_was_planted(world):
    """No MPI: the page's first_divergence on a clean job's records, and on each fault reading.py plants
    on rank 0, a middle rank and the last rank, names the planted rank, #k and field; the clean records,
    nothing."""
    page = load_lesson("14_hung_job.py")
    clean, cases = reading.grade(page.first_divergence, clean_entries(page), world, page.planted_seq)
    assert clean == "none"
    on = [(2, 0), (2, 1), (4, 1)] + [(world, R) for R in sorted({0, world // 2, world - 1})]
    assert [(c["world"], c["planted_on"]) for c in cases] == [p for p in on for _ in reading.ON_PAPER]
    assert [(c["rank"], c["seq"], c["field"]) for c in cases] == \
        [(R, 9 if f == "root" else 7, f) for _, R in on for f in reading.ON_PAPER], cases


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
    wrong = {"rank 0 is right": ("odd, ref = min(here, key=usual), here[max(here, key=usual)]",
                                 "odd, ref = min(r for r in here if here[r] != here[0]), here[0]"),
             "another line is a skip": ("(mine.site != ref.site and mine.site in elsewhere)",
                                        "mine.site != ref.site")}
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
    outcome, checks = lesson_run.run_lesson(les, n, api, "cpu", ["--fault", fault, "--fault-rank", str(R)],
                                        echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + verdict.explain(les, outcome, checks))
    where = f"--fault {fault} --fault-rank {R}, np {n}, {api}"
    assert verdict.status(outcome, checks) == "pass", f"{where}: {checks}\n{said}"
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
    outcome, checks = lesson_run.run_lesson(les, 3, "mpi4py", "gpu", ["--fault", fault, "--fault-rank", str(R)],
                                        echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + verdict.explain(les, outcome, checks))
    assert verdict.status(outcome, checks) == "pass" and outcome.results["device"] == "gpu", said
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
    outcome, checks = lesson_run.run_lesson(les, 3, api, "cpu", ["--fault", fault, "--fault-rank", str(R),
                                                              "--debug-collectives"], echo=False, timeout=LIMIT)
    said = "\n".join(outcome.tail[-15:] + verdict.explain(les, outcome, checks))
    assert any("CollectiveMismatch" in e for e in outcome.errors.values()), said
    assert not outcome.timed_out and verdict.status(outcome, checks) == "pass", said
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


# ---- two ranks: no majority (issue 38, H2) ----------------------------------------------------------

def two_rank_records(fault, R):
    """Two ranks' records (tests/test_flight.py's shape) with one fault on rank R, as the real faults
    leave them: a hang ends both records at #7; root's run goes on to the end."""
    steps = [dict(site="p.py:174"), dict(dtype="float64", count=1, site="p.py:180"),
             dict(op="broadcast", root=0, site="p.py:185")]
    clean = [flight_entry(k, **steps[(k - 1) % 3]) for k in range(1, 13)]
    ranks = {r: [dict(e) for e in clean[:6]] for r in range(2)}
    fault_call = {"skip": steps[1], "op": dict(op="all_gather", count=2048, site="p.py:171"),
                  "count": dict(count=512, site="p.py:172"), "dtype": dict(dtype="float64", site="p.py:172")}
    if fault == "root":
        ranks = {r: [dict(e) for e in clean] for r in range(2)}
        ranks[R][8]["root"] = 1
    else:
        ranks[R].append(flight_entry(7, state="started", **fault_call[fault]))
        ranks[1 - R].append(flight_entry(7, state="started", **steps[0]))
    return {r: ({"rank": r, "writes": len(es)}, es) for r, es in ranks.items()}


def flight_entry(seq, op="all_reduce", dtype="float32", count=1024, root=-1, site="p.py:174", state="completed"):
    return {"seq": seq, "kind": "coll", "op": op, "dtype": dtype, "count": count, "root": root, "comm": "world",
            "peers": "", "state": state, "t0": seq, "t1": 0.0, "site": site}


@pytest.mark.parametrize("R", [0, 1])
@pytest.mark.parametrize("fault", reading.ON_PAPER)
def test_at_two_ranks_the_program_s_order_breaks_the_tie(fault, R):
    """No MPI: at NP 2 each call has one vote, so "most ranks" names no one; the rank whose call is
    not the one the program made there before (the same call after the same line) is named, on rank 0
    as on rank 1, with the field the fault changed."""
    from common.runner import diagnose
    d = diagnose.diagnose(two_rank_records(fault, R), 2)
    assert (d["rank"], d["seq"], d["field"]) == (R, 9 if fault == "root" else 7, fault), d
    assert all(len(line) <= 96 for line in d["lines"]), d["lines"]


def test_a_tie_nothing_breaks_is_said_not_guessed():
    """Two ranks whose first calls differ: no majority and no earlier call to compare with. The
    diagnosis names no culprit: it says what each rank did and that the records cannot tell."""
    from common.runner import diagnose
    snap = {r: ({"rank": r, "writes": 1}, [flight_entry(1, count=100 * (r + 1), state="started")]) for r in (0, 1)}
    d = diagnose.diagnose(snap, 2)
    said = "\n".join(d["lines"])
    assert d["rank"] is None and d["ranks"] == [0, 1] and d["field"] == "unknown", d
    assert "cannot tell" in said and "rank 0: all_reduce #1 (float32 x 100" in said and "x 200" in said, said


@pytest.mark.parametrize("np", [2, 3])
def test_the_paper_grading_has_two_rank_ties_and_two_ranks_that_leave_the_majority(np):
    """At the check's NPs (2 and 3) the exercise is graded on paper on each of 2 ranks (no majority), on
    ranks 1 and 3 of 4 at once (two leave the majority alike: a tie of two groups) and at np, rank 0
    first and the last rank last; the page's reading names every one."""
    page = load_lesson("14_hung_job.py")
    clean, cases = reading.grade(page.first_divergence, clean_entries(page), np, page.planted_seq)
    assert clean == "none" and cases[0]["planted_on"] == 0 and cases[-1]["planted_on"] == np - 1
    assert {(c["world"], c["planted_on"], tuple(c["also"])) for c in cases} >= {(2, 0, ()), (2, 1, ()), (4, 1, (3,))}
    assert [(c["rank"], c["seq"], c["field"]) for c in cases] == \
        [(c["want_rank"], c["want_seq"], c["want_field"]) for c in cases], cases


def test_two_ranks_that_leave_the_majority_alike_are_told_apart_from_a_skip():
    """Mutation survivor m112 (tests/mutants.py 14 --sample 25 --seed 0): a reading that takes the
    others' calls at #seq as "elsewhere" reads two ranks' op fault, from the same new line, as a skip."""
    page = load_lesson("14_hung_job.py")
    source = inspect.getsource(page.first_divergence)
    old = "for c in calls if c.seq != seq}"
    assert old in source
    space = dict(vars(page))
    exec(textwrap.dedent(source.replace(old, "for c in calls if c.site != seq}")), space)
    _, cases = reading.grade(space["first_divergence"], clean_entries(page), 3, page.planted_seq)
    assert any(c["field"] != c["want_field"] for c in cases if c["also"]), cases


@pytest.mark.parametrize("api", [pytest.param(a, marks=torch_marks("14_hung_job", a)) for a in ("mpi4py", "torch")])
@pytest.mark.parametrize("R", [0, 1])
@pytest.mark.parametrize("fault", reading.ON_PAPER)
def test_at_np_2_a_fault_on_either_rank_is_named(fault, R, api):
    les = lesson()
    outcome, checks = lesson_run.run_lesson(les, 2, api, "cpu", ["--fault", fault, "--fault-rank", str(R)],
                                        echo=False, timeout=LIMIT)
    said = "\n".join(verdict.explain(les, outcome, checks))
    assert verdict.status(outcome, checks) == "pass", f"--fault {fault} --fault-rank {R}, {api}: {checks}\n{said}"
    assert (outcome.diagnosis["rank"], outcome.diagnosis["field"]) == (R, fault), said
    assert f"rank {1 - R} skipped" not in said and f"rank {1 - R}'s #" not in said, said


# ---- what a fault's run prints (issue 37.8, 38 L12), and `why` (L3, L7) -----------------------------

def test_a_fault_s_error_output_is_kept_and_said_in_one_line_after_the_diagnosis(tmp_path):
    """MPI's error stack and the ranks' tracebacks are not printed (they were 30-100 lines of up to 306
    columns, ranks interleaved mid-line): the diagnosis comes first, then one line says how the run
    ended and where the raw output is kept; every line within 100 columns."""
    state = {"TUTOR_STATE": str(tmp_path / "state")}
    ran = tutor("run", "14", "-n", "2", "--", "--fault", "count", "--fault-rank", "0", env=state)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    assert "error stack" not in out and "Traceback" not in out and "BAD TERMINATION" not in out, out
    assert all(len(line) <= 100 for line in out.splitlines()), max(out.splitlines(), key=len)
    why = ran.stderr
    order = [why.index(said) for said in ("why, from the ranks' flight records:", "how it ended:",
                                          "lines of error output")]
    assert order == sorted(order), why
    assert "rank 0's #7 differs: count 512 vs 1024" in why and "last-errors.txt" in why, why
    raw = (tmp_path / "state" / "last-errors.txt").read_text()
    assert "== rank " in raw and ("MPI_ERR_TRUNCATE" in raw or "truncated" in raw), raw


def test_why_after_a_check_that_hung_tells_of_that_check(tmp_path):
    """L3: a `check` run is remembered too: `why` after a check whose run hung speaks of that run, not
    of an earlier `run`'s diagnosis."""
    state = {"TUTOR_STATE": str(tmp_path / "state")}
    ran = tutor("run", "14", "-n", "2", "--", "--fault", "dtype", "--fault-rank", "1", env=state)
    assert ran.returncode == 0 and "14_hung_job" in tutor("why", env=state).stdout, ran.stderr
    hung = tutor("check", "04", env={**state, "TUTOR_LESSONS": FIXTURES})
    assert hung.returncode != 0, hung.stdout + hung.stderr
    again = tutor("why", env=state)
    assert "04_hang np=2 api=mpi4py: timeout" in again.stdout and "14_hung_job" not in again.stdout, again.stdout
    # issue 37.9: `why` knew only the last run; `why ID` tells of that lesson's last run
    mine = tutor("why", "14", env=state)
    assert mine.returncode == 0 and "14_hung_job np=2 api=mpi4py" in mine.stdout, mine.stdout + mine.stderr
    assert "rank 1" in mine.stdout and "04_hang" not in mine.stdout, mine.stdout
    fixture = tutor("why", "04", env={**state, "TUTOR_LESSONS": FIXTURES})
    assert "04_hang np=2 api=mpi4py: timeout" in fixture.stdout, fixture.stdout
    none = tutor("why", "00", env=state)
    assert none.returncode == 1 and none.stdout.strip() == "no run of 00_hello recorded yet: `bin/tutor run 00` first"


@pytest.mark.parametrize("damage", ['{"run": "x", "status": "pass", "diagnosis": {"lines": 5}}',
                                    '{"run": "x", "status": "pass", "diagnosis": {"lines": true}}',
                                    '{"run": 5, "status": "pass"}', "[1, 2", "fifo", "/dev/zero", "dir"])
def test_why_reads_a_damaged_record_in_one_line(damage, tmp_path):
    """L7: a last-why.json that holds the wrong types, is not JSON, is a FIFO, a link to /dev/zero or a
    folder: one line naming the file, exit 1, at once (no traceback, no hang, no MemoryError)."""
    import os
    folder = tmp_path / "state"
    folder.mkdir()
    path = folder / "last-why.json"
    if damage == "fifo":
        os.mkfifo(path)
    elif damage == "/dev/zero":
        os.symlink("/dev/zero", path)
    elif damage == "dir":
        path.mkdir()
    else:
        path.write_text(damage)
    said = tutor("why", env={"TUTOR_STATE": str(folder)}, timeout=60)
    assert said.returncode == 1 and "Traceback" not in said.stderr, said.stdout + said.stderr
    lines = (said.stdout + said.stderr).strip().splitlines()  # one line, wrapped where the path is long
    assert lines[0].startswith("tutor: the last run's record ") and "last-why.json" in lines[-1], lines
    assert len(lines) <= 2 and all(len(line) <= 100 for line in lines), lines


def test_a_rank_waiting_for_a_core_is_not_called_stuck(monkeypatch):
    """The runner ends a planted hang once every rank waited stuck_s in a call, nothing moving; a
    runnable rank that had no CPU meanwhile (4 busy-waiting ranks on 2 cores, a loaded machine) may be
    about to get its message: the run goes on until each rank had a share of a core or sleeps."""
    from common.runner import flightwatch
    snap = {r: ({"writes": 5}, [flight_entry(5, state="started")]) for r in range(3)}
    monkeypatch.setattr(flightwatch, "read", lambda run_dir: snap)
    monkeypatch.setattr(flightwatch, "planted", lambda run_dir: {"np": 3, "stuck_s": 1.0})
    cpu = {0: (1.0, "R"), 1: (1.0, "S"), 2: (1.0, "R")}
    watch = flightwatch.Watch("run", cpu=lambda run_dir: dict(cpu))
    assert not watch.poll(0.0)                       # the records stop moving here
    cpu.update({0: (1.6, "R"), 1: (1.0, "S"), 2: (1.05, "R")})  # rank 2 runnable, 0.05 s of CPU
    assert not watch.poll(1.5)
    cpu[2] = (1.2, "R")                              # it had its share and still waits: stuck
    assert watch.poll(2.0) and watch.early == 2.0
    moving = flightwatch.Watch("run", cpu=lambda run_dir: {r: (1.0, "S") for r in range(3)})  # asleep
    assert not moving.poll(0.0)
    snap[1] = ({"writes": 6}, [flight_entry(6, state="started")])  # a record moved: the clock restarts
    assert not moving.poll(1.5) and not moving.poll(2.0) and moving.poll(2.5)
