"""Lesson 15 beyond its check grid: 6 ranks in groups standing in for nodes, 2 x 3 and 3 x 2 (block
and round-robin placement), every YAML check, both APIs (torch's runs go to `make test-torch`); its pure
helpers; and the rule that its `check` grades where mistakes differ. `make check` runs the YAML's grid
(NP 6 = 3 x 2 round-robin, NP 8 = 2 x 4 block, both APIs); these are the shapes it does not run."""
import argparse
import os

import pytest

from common.runner import catalog, lesson_run, verdict
from conftest import ROOT, torch_marks, tutor
from lessons.hierarchy import model, reference, show
from readable import problems as unreadable  # every line <= 100 columns, nothing said N times

LESSON = catalog.resolve("15", os.path.join(ROOT, "lessons"))
QUICK = ["--no-race", "--tokens", "32"]


@pytest.mark.parametrize("api, k, placement", [
    pytest.param("mpi4py", 3, "block", id="mpi4py-2x3-block"),  # 3 x 2 round-robin: the check's NP 6
    pytest.param("torch", 3, "round-robin", id="torch-2x3-round-robin", marks=torch_marks(LESSON.name, "torch")),
    pytest.param("torch", 2, "block", id="torch-3x2-block", marks=torch_marks(LESSON.name, "torch")),
])
def test_six_ranks_in_pretend_nodes(api, k, placement, capfd):
    outcome, checks = lesson_run.run_lesson(LESSON, 6, api, "cpu", ["--ranks-per-node", str(k), "--placement",
                                                                placement, *QUICK])
    said = capfd.readouterr()
    tail = "\n".join((said.out + said.err).splitlines()[-30:] + verdict.explain(LESSON, outcome, checks))
    assert verdict.ok(outcome, checks) and checks and all(c["ok"] for c in checks), tail
    params = outcome.results["params"]
    assert (params["k"], params["nodes"], params["placement"], params["real"]) == (k, 6 // k, placement, 0)
    assert "== 4. mixture-of-experts dispatch" in said.out, tail
    bad = unreadable(said.out + said.err, 6)
    assert not bad, "hard to read at 6 ranks:\n" + "\n".join(bad[:10])
    summary = outcome.results["summary"]
    # two levels: each rank sends about 2(M-1)/M x C/K across; a flat ring's edge rank about 2(N-1)/N x C
    assert summary["two_across_max"] < summary["flat_across_max"], tail
    assert sum(summary["two_across_per_node"]) == summary["two_across_total"], tail  # per node: the same
    assert sum(summary["flat_across_per_node"]) == summary["flat_across_total"], tail  # bytes, split
    assert "Counted across nodes: the most one rank sent was" in said.out, tail


@pytest.mark.parametrize("flags, says", [
    (["--ranks-per-node", "3"], "--ranks-per-node 3 does not divide 4 ranks"),
    (["--groups", "2x2:block", "--placement", "block"], "--groups sets K and the placement: give it, or"),
    (["--groups", "2x2:diagonal"], "expected MxK:block or MxK:round-robin (M groups of K ranks), got"),
])
def test_a_shape_that_cannot_be_is_one_line(flags, says):
    proc = tutor("run", "15", "-n", "4", "--", *flags, *QUICK, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "PASS" not in text, text
    assert says in text and "Traceback" not in text, text


def test_groups_pick_the_layout_of_the_world_size():
    groups = reference.parse_groups("3x2:round-robin, 2x4:block")
    assert groups == [(3, 2, "round-robin"), (2, 4, "block")]
    assert reference.group_for(groups, 6) == (2, "round-robin") and reference.group_for(groups, 8) == (4, "block")
    assert reference.group_for(groups, 4) is None and reference.group_for(None, 4) is None
    for bad in ("3x2", "3x2:block,6x1:round-robin", "0x2:block", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            reference.parse_groups(bad)


def test_check_grades_where_the_mistakes_differ():
    """GUIDE §4: `bin/tutor check 15` runs K > M and M > K (a ring or list sized by K instead of M
    fails), and both placements with M, K > 1 (rank // K fails round-robin, rank % M fails blocks)."""
    args = LESSON.meta["args"]
    groups = reference.parse_groups(args[args.index("--groups") + 1])
    shapes = [(n // k, k, p) for n in LESSON.meta["np"]["check"] for k, p in [reference.group_for(groups, n)]]
    assert all(m > 1 and k > 1 for m, k, _ in shapes), shapes
    assert {p for _, _, p in shapes} == {"block", "round-robin"}, shapes
    assert any(k > m for m, k, _ in shapes) and any(m > k for m, k, _ in shapes), shapes
    truths = [[reference.pretend_node(r, m * k, k, p) for r in range(m * k)] for m, k, p in shapes]
    by_block = [[r // k for r in range(m * k)] for m, k, _ in shapes]            # rank // K
    by_round = [[r % m for r in range(m * k)] for m, k, _ in shapes]             # rank % M
    assert any(t != b for t, b in zip(truths, by_block)) and any(t != r for t, r in zip(truths, by_round))

def race_rows(flat_us, two_us, noise_us):
    return [{"size": 4096, "algo": "flat ring", "time_us": flat_us, "noise_us": noise_us},
            {"size": 4096, "algo": "two levels", "time_us": two_us, "noise_us": noise_us / 2}]


@pytest.mark.parametrize("kind, m, flat_us, two_us, noise, says", [
    ("pretend", 2, 1000.0, 900.0, 150.0, "a tie within this run's noise"),
    ("real", 2, 1000.0, 900.0, 150.0, "a tie within this run's noise"),
    ("pretend", 2, 1000.0, 500.0, 100.0, "The groups stand in for nodes on one node"),
    ("pretend", 3, 1000.0, 500.0, 100.0, "(2 inside a node with messages M = 3 x the flat ring's, 4 across"),
    ("real", 2, 500.0, 1000.0, 100.0, "the most one rank sent across was 1.50 x C flat, 0.50 x C in"),
    ("real", 2, 500.0, 1000.0, 100.0, "the most one node sent, 1.50 x C and 1.00 x C"),
    ("real", 1, 1000.0, 500.0, 100.0, "One node: two levels are lesson 09's halves alone"),
])
def test_the_race_is_read_only_beyond_its_noise(kind, m, flat_us, two_us, noise, says):
    lay = {"kind": kind, "m": m, "k": 2}
    text = show.race_verdict(race_rows(flat_us, two_us, noise), lay,
                             {"flat_across_max": 300, "two_across_max": 100, "buffer_bytes": 200,
                              "flat_across_node_max": 300, "two_across_node_max": 200}, "mpi")
    assert says in text, text
    tie = abs(flat_us - two_us) <= noise
    assert ("beat" in text) != tie and ("stand in" in text or "sent across" in text or "One node" in text) != tie
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


@pytest.mark.parametrize("m, node, says, not_said", [
    (2, [300, 200], "the most one node sent, 300 B flat, 200 B in two levels (x1.50)", None),
    (2, [300, 0], "the most one node sent, 300 B flat, 0 B in two levels.", "(x"),  # no ratio over 0
])
def test_bytes_across_are_said_per_rank_and_per_node_as_counted(m, node, says, not_said):
    sums = {"flat_across_max": 300, "two_across_max": 100, "flat_across_node_max": node[0],
            "two_across_node_max": node[1]}
    text = show.measured_across(sums, m, 200)
    assert "the most one rank sent was 300 B flat, 100 B in two levels (x3.00)" in text, text
    assert says in text and "would send about 2(M-1)/M x C = 200 B from each node" in text, text
    assert not_said is None or not_said not in text.split("the most one node")[1], text


@pytest.mark.parametrize("placement, edges, ratio", [("block", 1, 1.5), ("round-robin", 2, 3.0)])
def test_the_model_on_a_link_alone_gives_the_closed_forms(placement, edges, ratio):
    """N = 4 = 2 nodes x 2: with only the link between nodes costing time (alpha 0, inside free), the
    flat ring pushes 2(N-1)/N x C x edges into a node, two levels C: 1.5 placed in blocks, 3 round-robin."""
    places = reference.truth([reference.pretend_node(r, 4, 2, placement) for r in range(4)])
    lay = {"k": 2, "m": 2, "places": places}
    assert model.edges_in(places, 4) == edges
    flat, two = model.predict({"in": (0.0, 0.0), "x": (0.0, 1e-8)}, lay, 4, 1 << 22)
    assert flat / two == pytest.approx(ratio)
    slow_inside = model.predict({"in": (0.0, 1e-8), "x": (0.0, 1e-8)}, lay, 4, 1 << 22)
    assert slow_inside[0] / slow_inside[1] < ratio  # two levels pay for their steps inside too
