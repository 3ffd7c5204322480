"""Unit tests of lessons 00-04's pure helpers: no MPI, each lesson loaded as a module (conftest)."""
import types

import numpy as np
import pytest

from common.shards import counts_displs
from conftest import load_lesson
from lessons.send_recv_deadlock.watch import Unbuffered

L02 = load_lesson("02_isend_irecv.py")
L03 = load_lesson("03_broadcast_scatter.py")
L04 = load_lesson("04_allgather_softmax_l2.py")


# ---- 01: the communicator that buffers nothing
class Request:
    def __init__(self, done):
        self.done = done

    def Test(self):
        return self.done


def test_unbuffered_send_waits_for_its_receive_and_says_deadlock():
    calls = []
    comm = types.SimpleNamespace(rank=1, size=2, Issend=lambda buf, dest, tag: calls.append("Issend") or Request(False),
                                 Irecv=lambda buf, source, tag: Request(True))
    strict = Unbuffered(comm, 0.05)
    strict.Recv(None, source=0, tag=1)                      # a matched receive returns
    with pytest.raises(RuntimeError, match=r"deadlock: rank 1's Send\(dest=0\) waited 0.05 s"):
        strict.Send(None, dest=0, tag=1)                    # a plain Send is held to Ssend's rule
    assert calls == ["Issend"]


# ---- 02: what a buffer holds
def test_contents_tells_old_new_and_part():
    assert L02.contents(np.full(4, -1.0), -1.0, 3.0) == "old"
    assert L02.contents(np.full(4, 3.0), -1.0, 3.0) == "new"
    assert L02.contents(np.array([3.0, 3.0, -1.0, -1.0]), -1.0, 3.0) == "part new"
    assert L02.contents(np.full(4, 7.0), -1.0, 3.0) == "part new"   # a wrong message is not "new"


def test_a_mode_counts_as_hiding_only_beyond_the_noise():
    times = {"comm only": 1.0, "compute only": 1.0, L02.CONTROL: 2.0, "(b) post, compute, wait": 1.5}
    (line,) = L02.what_was_seen(times, {"(a)": 0.0, "(b)": 0.5}, 0.0, None)
    assert "hid +0.50" in line and "a real overlap" in line
    (line,) = L02.what_was_seen(times, {"(a)": 0.0, "(b)": 0.5}, 0.4, None)  # noisy: the bar is 0.6
    assert "within noise" in line
    (line,) = L02.what_was_seen(times, {"(a)": 0.0, "(b)": -0.9}, 0.1, None)
    assert "slower than (a)" in line


def test_hidden_is_zero_for_the_control_and_one_when_the_shorter_part_is_gone():
    assert L02.hidden_of(2.0, 2.0, 1.0, 1.0) == 0.0
    assert L02.hidden_of(1.0, 2.0, 1.0, 1.0) == 1.0
    assert L02.hidden_of(3.0, 2.0, 1.0, 1.0) == -1.0   # slower than one after the other
    assert L02.noise_of({"comm only": 1.0, "compute only": 2.0, L02.CONTROL: 3.5}) == 0.5


def test_d_is_said_slower_than_this_jobs_control_only_when_it_is():
    times = {"comm only": 1.0, "compute only": 1.0, L02.CONTROL: 2.0, "(b) post, compute, wait": 2.0,
             L02.D_MODE: 8.0}
    child = {"times": {"comm only": 5.0, "compute only": 5.0, L02.CONTROL: 10.0, "(b) post, compute, wait": 8.0}}
    lines = L02.what_was_seen(times, {"(a)": 0.0, "(b)": 0.0, "(d)": 0.4}, 0.0, child)
    assert "vs its own job's (a)" in lines[1] and "a real overlap" in lines[1]
    assert "5.0 x and 5.0 x this job's" in lines[2] and "4.00 x (a)" in lines[2]
    times[L02.D_MODE] = 2.1                                  # within this job's noise: no such line
    assert len(L02.what_was_seen(times, {"(a)": 0.0, "(b)": 0.0, "(d)": 0.4}, 0.0, child)) == 2


# ---- 03: shard sizes, the tree broadcast's schedule
@pytest.mark.parametrize("count, n", [(10, 4), (0, 3), (3, 4), (65536, 3), (7, 7), (1, 1)])
def test_shard_sizes_is_the_kits_convention(count, n):
    assert L03.shard_sizes(count, n) == tuple(map(list, counts_displs(count, n)))


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("root_of", [lambda n: 0, lambda n: n - 1, lambda n: n // 2])
def test_tree_broadcast_reaches_every_rank_once_from_a_holder(n, root_of):
    root = root_of(n)
    rounds = {}  # rank -> [(kind, peer)] in order
    for rank in range(n):
        ops = []
        wire = types.SimpleNamespace(group=lambda sends, recvs, ops=ops: ops.append(
            ("send", sends[0][1]) if sends else ("recv", recvs[0][1])))
        L03.tree_broadcast(types.SimpleNamespace(world_size=n, rank=rank), wire, "buf", root)
        rounds[rank] = ops
    holders = {root}
    sends = sorted((r, peer) for r, ops in rounds.items() for kind, peer in ops if kind == "send")
    recvs = sorted((peer, r) for r, ops in rounds.items() for kind, peer in ops if kind == "recv")
    assert sends == recvs, "every send meets the receive posted for it"
    assert len(recvs) == n - 1 and {r for _, r in recvs} == set(range(n)) - {root}
    for rank, ops in rounds.items():  # a rank receives once, before it sends anything
        kinds = [k for k, _ in ops]
        assert kinds.count("recv") == (rank != root) and (rank == root or kinds[0] == "recv")
    for src, dst in sorted(sends, key=lambda p: (p[1] - root) % n):  # in the order ranks are reached
        assert src in holders
        holders.add(dst)


# ---- 04: the gradient tells a local max from the global one; the norm's closed form
@pytest.mark.parametrize("vocab, n", [(3001, 2), (3001, 4), (32000, 4), (10, 3)])
def test_every_shard_has_its_own_max_and_the_norm_has_a_closed_form(vocab, n):
    from common.shards import chunk_bounds
    shards = [L04.gradient_shard(a, b, vocab, 1.0) for a, b in chunk_bounds(vocab, n)]
    maxima = [float(np.max(np.abs(g))) for g in shards]
    assert len(set(maxima)) == n, "a norm scaled by a rank's own max would pass unnoticed"
    g = np.concatenate(shards).astype(np.float64)
    closed = np.sqrt(vocab * (vocab + 1) * (2 * vocab + 1) / 6) * 2 / vocab   # as the YAML says
    assert np.isclose(np.linalg.norm(g), closed, rtol=1e-6)
