"""Lesson 15 beyond its check NP: 6 ranks in pretend nodes, 2 x 3 and 3 x 2 (block and round-robin
placement), every YAML check, both APIs (torch's runs go to `make test-torch`); and its pure helpers.
`make check` runs NP 4 only (2 nodes x 2): 6 ranks on 2 cores cost seconds a run, so they are here."""
import os

import pytest

from common.runner import catalog, engine
from conftest import ROOT, torch_marks, tutor
from lessons.hierarchy import reference, show

from readable import problems as unreadable  # every line <= 100 columns, nothing said N times

LESSON = catalog.resolve("15", os.path.join(ROOT, "lessons"))
QUICK = ["--no-race", "--tokens", "32"]


@pytest.mark.parametrize("api, k, placement", [
    pytest.param("mpi4py", 3, "block", id="mpi4py-2x3-block"),
    pytest.param("mpi4py", 2, "round-robin", id="mpi4py-3x2-round-robin"),
    pytest.param("torch", 3, "round-robin", id="torch-2x3-round-robin", marks=torch_marks(LESSON.name, "torch")),
    pytest.param("torch", 2, "block", id="torch-3x2-block", marks=torch_marks(LESSON.name, "torch")),
])
def test_six_ranks_in_pretend_nodes(api, k, placement, capfd):
    outcome, checks = engine.run_lesson(LESSON, 6, api, "cpu", ["--ranks-per-node", str(k), "--placement",
                                                                placement, *QUICK])
    said = capfd.readouterr()
    tail = "\n".join((said.out + said.err).splitlines()[-30:] + engine.explain(LESSON, outcome, checks))
    assert engine.ok(outcome, checks) and checks and all(c["ok"] for c in checks), tail
    params = outcome.results["params"]
    assert (params["k"], params["nodes"], params["placement"], params["real"]) == (k, 6 // k, placement, 0)
    assert "== 4. mixture-of-experts dispatch" in said.out, tail
    bad = unreadable(said.out + said.err, 6)
    assert not bad, "hard to read at 6 ranks:\n" + "\n".join(bad[:10])
    summary = outcome.results["summary"]
    # two levels: each rank sends about 2(M-1)/M x C/K across; a flat ring's edge rank about 2(N-1)/N x C
    assert summary["two_across_max"] < summary["flat_across_max"], tail


def test_a_ranks_per_node_that_does_not_divide_the_world_is_one_line():
    proc = tutor("run", "15", "-n", "4", "--", "--ranks-per-node", "3", *QUICK, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "PASS" not in text, text
    assert "--ranks-per-node 3 does not divide 4 ranks" in text and "Traceback" not in text, text


@pytest.mark.parametrize("n, k", [(4, 2), (6, 3), (6, 2), (8, 4)])
def test_pretend_placements_and_what_truth_reads_back(n, k):
    for placement in ("block", "round-robin"):
        labels = [reference.pretend_node(r, n, k, placement) for r in range(n)]
        places = reference.truth(labels)
        assert sorted(labels.count(x) for x in set(labels)) == [k] * (n // k)  # equal nodes
        assert reference.placement_of(places, k, n // k) == placement or n // k == 1 or k == 1
    assert reference.placement_of([(0, 0), (1, 0), (1, 1), (0, 1)], 2, 2) == "other"


def race_rows(flat_us, two_us, noise_us):
    return [{"size": 4096, "algo": "flat ring", "time_us": flat_us, "noise_us": noise_us},
            {"size": 4096, "algo": "two levels", "time_us": two_us, "noise_us": noise_us / 2}]


@pytest.mark.parametrize("kind, m, flat_us, two_us, noise, says", [
    ("pretend", 2, 1000.0, 900.0, 150.0, "a tie within this run's noise"),
    ("real", 2, 1000.0, 900.0, 150.0, "a tie within this run's noise"),
    ("pretend", 2, 1000.0, 500.0, 100.0, "The nodes are pretend"),
    ("pretend", 3, 1000.0, 500.0, 100.0, "(2 inside a node with messages M = 3 x the flat ring's, 4 across"),
    ("real", 2, 500.0, 1000.0, 100.0, "the most one rank sent across was 1.50 x C flat, 0.50 x C in"),
    ("real", 1, 1000.0, 500.0, 100.0, "One node: two levels are lesson 09's halves alone"),
])
def test_the_race_is_read_only_beyond_its_noise(kind, m, flat_us, two_us, noise, says):
    lay = {"kind": kind, "m": m, "k": 2}
    text = show.race_verdict(race_rows(flat_us, two_us, noise), lay,
                             {"flat_across_max": 300, "two_across_max": 100, "buffer_bytes": 200}, "mpi")
    assert says in text, text
    tie = abs(flat_us - two_us) <= noise
    assert ("beat" in text) != tie and ("pretend" in text or "sent across" in text or "One node" in text) != tie
    if not tie:
        assert ("two levels beat the flat ring" in text) == (two_us < flat_us), text


def test_the_meter_counts_by_where_the_peer_really_runs():
    """common/subgroups.Meter: a send is inside or across by the destination's real node (home of
    its world rank, through members), and the backend still gets the sub-communicator's numbers."""
    import types

    import numpy as np

    from common import subgroups
    peers = []
    be = types.SimpleNamespace(exchange=lambda out, into, dest, source: peers.append(dest), sync=lambda: None)
    meter = subgroups.Meter(home=["a", "b", "a", "b"], mine="a")
    sub = meter.wrap(be, members=[0, 3])  # sub rank 1 is world rank 3, on node b
    with meter.phase("p"):
        sub.exchange(np.zeros(5), np.zeros(5), 1, 1)
        sub.exchange(np.zeros(2), np.zeros(2), 0, 0)
    sub.exchange(np.zeros(7), np.zeros(7), 1, 1)  # outside the phase: counted under "main"
    assert meter.sent("p") == {"steps": 2, "inside": 16, "across": 40}
    assert meter.sent("main") == {"steps": 1, "inside": 0, "across": 56}
    assert peers == [1, 0, 1]
