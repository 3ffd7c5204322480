"""Lesson 15 beyond its check NP: 6 ranks in pretend nodes, 2 x 3 and 3 x 2 (block and round-robin
placement), every YAML check, both APIs (torch's runs go to `make test-torch`); and its pure helpers.
`make check` runs NP 4 only (2 nodes x 2): 6 ranks on 2 cores cost seconds a run, so they are here."""
import os

import pytest

from common.runner import catalog, engine
from conftest import ROOT, load_lesson, torch_marks, tutor

LESSON = catalog.resolve("15", os.path.join(ROOT, "lessons"))
fifteen = load_lesson("15_hierarchy.py")
QUICK = ["--no-race", "--tokens", "32"]


@pytest.mark.parametrize("api, k, placement", [
    pytest.param("mpi4py", 3, "block", id="mpi4py-2x3-block"),
    pytest.param("mpi4py", 2, "round-robin", id="mpi4py-3x2-round-robin"),
    pytest.param("torch", 3, "round-robin", id="torch-2x3-round-robin", marks=torch_marks(LESSON.name, "torch")),
    pytest.param("torch", 2, "block", id="torch-3x2-block", marks=torch_marks(LESSON.name, "torch")),
])
def test_six_ranks_in_pretend_nodes(api, k, placement, capfd):
    outcome, checks = engine.run_lesson(LESSON, 6, api, "cpu", ["--ranks-per-node", str(k), "--placement",
                                                                placement, *QUICK], echo=False)
    said = capfd.readouterr()
    tail = "\n".join((said.out + said.err).splitlines()[-30:] + engine.explain(LESSON, outcome, checks))
    assert engine.ok(outcome, checks) and checks and all(c["ok"] for c in checks), tail
    params = outcome.results["params"]
    assert (params["k"], params["nodes"], params["placement"], params["real"]) == (k, 6 // k, placement, 0)
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
        labels = [fifteen.pretend_node(r, n, k, placement) for r in range(n)]
        places = fifteen.truth(labels)
        assert sorted(labels.count(x) for x in set(labels)) == [k] * (n // k)  # equal nodes
        assert fifteen.placement_of(places, k, n // k) == placement or n // k == 1 or k == 1
    assert fifteen.placement_of([(0, 0), (1, 0), (1, 1), (0, 1)], 2, 2) == "other"
