"""The flight recorder (common/flight.py) and the diagnosis read from it (common/runner/diagnose.py):
pure functions and one process, no MPI."""
import types

import numpy as np
import pytest

from common import flight
from common.plumbing import recorded, run_folder
from common.runner import diagnose


@pytest.fixture
def on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(run_folder.ENV, str(tmp_path))
    yield tmp_path
    flight._ME.clear()


def test_a_started_call_is_on_disk_before_it_returns(on_disk):
    rec = flight.install(2)
    buf = np.zeros(1024, np.float32)
    slot = rec.begin("all_reduce", "coll", buf, "world")
    record = run_folder.rank_file(on_disk, 2, "flight")
    head, entries = flight.parse(open(record, "rb").read())  # as a blocked rank leaves it
    assert head["rank"] == 2 and entries[-1]["state"] == "started"
    assert (entries[-1]["op"], entries[-1]["dtype"], entries[-1]["count"], entries[-1]["seq"]) == \
        ("all_reduce", "float32", 1024, 1)
    assert entries[-1]["site"].startswith("test_flight.py:")  # the caller's line, not common/'s
    rec.end(slot)
    head2, entries = flight.parse(open(record, "rb").read())
    assert entries[-1]["state"] == "completed" and head2["writes"] > head["writes"]


def test_the_ring_keeps_the_last_calls_numbered_per_communicator(on_disk):
    rec = flight.install(0)
    for i in range(flight.SLOTS + 10):
        with rec.call("all_reduce", np.zeros(i + 1), comm="world" if i % 2 else "group[0,1]"):
            pass
    entries = rec.entries()
    assert len(entries) == flight.SLOTS
    world = [e["seq"] for e in entries if e["comm"] == "world"]
    assert world == list(range(world[0], world[0] + len(world))) and world[-1] == (flight.SLOTS + 10) // 2


def test_gpu_calls_are_enqueued_until_a_sync(on_disk):
    rec = flight.install(0, gpu=True)
    be = recorded.wrap(types.SimpleNamespace(allreduce=lambda buf: None, sync=lambda: None))
    be.allreduce(np.zeros(4, np.float32))
    assert rec.entries()[-1]["state"] == "enqueued"
    be.sync()
    assert rec.entries()[-1]["state"] == "completed"


def test_a_started_transfer_completes_when_waited_for(on_disk):
    rec = flight.install(1)
    handle = types.SimpleNamespace(wait=lambda: None)
    be = recorded.wrap(types.SimpleNamespace(start=lambda sends, recvs: handle))
    h = be.start([(np.zeros(3), 2)], [(np.zeros(3), 0)])
    assert rec.entries()[-1]["state"] == "started" and rec.entries()[-1]["peers"] == "s2 r0"
    h.wait()
    assert rec.entries()[-1]["state"] == "completed"


def e(seq, op="all_reduce", dtype="float32", count=1024, root=-1, comm="world", state="completed",
      site="job.py:10", kind="coll", peers="", t0=None):
    return {"seq": seq, "kind": kind, "op": op, "dtype": dtype, "count": count, "root": root, "comm": comm,
            "peers": peers, "state": state, "t0": t0 if t0 is not None else seq, "t1": 0.0, "site": site}


def snap(per_rank):
    return {r: ({"rank": r, "writes": len(es)}, es) for r, es in per_rank.items()}


def history():
    return [e(1, site="job.py:10"), e(2, dtype="float64", count=1, site="job.py:12")]


def test_equal_records_give_no_diagnosis():
    assert diagnose.diagnose(snap({r: history() for r in range(4)}), 4) is None


@pytest.mark.parametrize("field, odd", [("count", {"count": 512}), ("dtype", {"dtype": "float64"}),
                                        ("op", {"op": "all_gather"}), ("root", {"root": 1})])
def test_a_differing_field_is_named(field, odd):
    ranks = {r: history() + [e(3, state="started")] for r in range(3)}
    ranks[1][-1].update(odd)
    d = diagnose.diagnose(snap(ranks), 3)
    assert (d["rank"], d["seq"], d["field"]) == (1, 3, field)
    assert any(f"{field} " in line for line in d["lines"])


def test_a_skipped_call_is_told_from_a_differing_one():
    ranks = {r: history() + [e(3, state="started")] for r in range(3)}
    ranks[2][-1] = e(3, dtype="float64", count=1, site="job.py:12", state="started")  # the next call's line
    d = diagnose.diagnose(snap(ranks), 3)
    assert (d["rank"], d["seq"], d["field"]) == (2, 3, "skip")
    assert "rank 2 skipped #3" in "\n".join(d["lines"])


def test_another_communicator_and_a_missing_rank():
    ranks = {r: history() + [e(3, state="started")] for r in range(3)}
    ranks[0][-1] = e(1, comm="group[0,1]", state="started")
    d = diagnose.diagnose(snap(ranks), 3)
    assert (d["rank"], d["seq"], d["field"], d["comm"]) == (0, 3, "comm", "world")
    ranks[0] = history()  # computing: outside any call; moving: its record still changes
    assert diagnose.diagnose(snap(ranks), 3)["field"] == "skip"
    assert diagnose.diagnose(snap(ranks), 3, moving={0})["field"] == "slow"


@pytest.mark.parametrize("lag", ["started", "completed"])
def test_a_rank_that_has_not_reached_the_call_is_late_not_the_fault(lag):
    """A crash can end a run while a slow rank is still in #2 (or just out of it), which the others
    finished before the call that broke (rank 1's #4, count 512): that call is named, the slow rank is
    said to be late. Where nothing else differs (a hang that left rank 2 there), rank 2 is the finding."""
    ranks = {r: history() + [e(3, op="broadcast", root=0, site="job.py:14"), e(4, state="started")]
             for r in range(4)}
    ranks[1][-1]["count"] = 512
    ranks[2] = [e(1, site="job.py:10"), e(2, dtype="float64", count=1, site="job.py:12", state=lag)]
    d = diagnose.diagnose(snap(ranks), 4)
    assert (d["rank"], d["seq"], d["field"], d["late"]) == (1, 4, "count", [2])
    assert "rank 2 had not reached #4 when the run ended: late" in "\n".join(d["lines"])
    ranks[1][-1]["count"] = 1024
    d = diagnose.diagnose(snap(ranks), 4)
    assert (d["rank"], d["seq"], d["field"]) == (2, 3, "skip") and "never called #3" in "\n".join(d["lines"])


def test_a_point_to_point_cycle():
    ranks = {r: history() + [e(3, state="started")] for r in range(4)}
    ranks[1][-1] = e(1, op="recv", kind="p2p", peers="r2", state="started", t0=9)
    ranks[2][-1] = e(1, op="recv", kind="p2p", peers="r1", state="started", t0=9)
    d = diagnose.diagnose(snap(ranks), 4)
    assert d["field"] == "p2p-cycle" and d["ranks"] == [1, 2]
    assert "rank 1 waits to receive from 2; rank 2 waits to receive from 1" in d["lines"][0]
    # on a GPU the host queues on: the rank waits in its earliest call not completed
    ranks[1][-1]["state"] = ranks[2][-1]["state"] = "enqueued"
    ranks[1].append(e(2, op="send", kind="p2p", peers="s2", state="enqueued", t0=10))
    ranks[2].append(e(2, op="send", kind="p2p", peers="s1", state="enqueued", t0=10))
    assert diagnose.diagnose(snap(ranks), 4)["ranks"] == [1, 2]


def test_stuck_means_every_rank_inside_a_call():
    ranks = {r: history() + [e(3, state="started")] for r in range(2)}
    assert diagnose.stuck(snap(ranks), 2)
    ranks[1] = history()
    assert not diagnose.stuck(snap(ranks), 2)
    assert not diagnose.stuck(snap({0: ranks[0]}), 2)


def test_a_timing_loop_is_one_slot_so_the_clock_measures_the_library(on_disk):
    rec = flight.install(0)
    be = recorded.wrap(types.SimpleNamespace(allreduce=lambda buf: None))
    be.allreduce(np.zeros(2))
    with rec.timed(1000):
        assert rec.entries()[-1]["op"] == "timed loop" and rec.entries()[-1]["state"] == "started"
        for _ in range(1000):
            be.allreduce(np.zeros(2))
    be.allreduce(np.zeros(2))
    ops = [(e["op"], e["seq"], e["state"]) for e in rec.entries()]
    assert ops == [("all_reduce", 1, "completed"), ("timed loop", 1, "completed"), ("all_reduce", 2, "completed")]
