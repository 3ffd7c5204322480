"""The counting communicator (common/counting.py): exact p2p bytes, nominal collective bytes, phases,
and no method left uncounted."""
import types

import numpy as np
import pytest

from common import counting


def fake_backend(log):
    return types.SimpleNamespace(
        exchange=lambda out, into, dest, source: log.append(("exchange", dest, source)),
        group=lambda sends, recvs: log.append(("group", len(sends), len(recvs))),
        allreduce=lambda buf: log.append(("allreduce", buf.size)),
        all_gather=lambda out, inp: log.append(("all_gather", inp.size)),
        sync=lambda: log.append(("sync",)))


def test_point_to_point_counts_what_was_sent_per_phase():
    log = []
    be = counting.Counted(fake_backend(log), 4)
    a, b, empty = np.zeros(10, np.float32), np.zeros(3, np.int64), np.zeros(0)
    be.exchange(a, b, 1, 3)
    with be.phase("backward"):
        be.group([(a, 2), (b, 3), (empty, 1)], [(a, 2)])
        be.exchange(empty, a, 1, 3)  # receives only: a call, no message
    be.sync()
    assert log[0] == ("exchange", 1, 3) and len(log) == 4  # every call still reaches the backend
    assert be.counts == {
        "main": {"exchange": {"calls": 1, "msgs": 1, "bytes": 40, "recv_bytes": 24, "peers": [1]}},
        "backward": {"group": {"calls": 1, "msgs": 2, "bytes": 64, "recv_bytes": 40, "peers": [2, 3]},
                     "exchange": {"calls": 1, "msgs": 0, "bytes": 0, "recv_bytes": 40, "peers": []}}}
    assert be.total() == 104 and be.total(phases=["backward"], field="msgs") == 2


def test_library_collectives_count_the_ring_volume_and_say_so():
    be = counting.Counted(fake_backend([]), 4)
    with be.phase("step"):
        be.allreduce(np.zeros(100, np.float64))     # 2(N-1)/N of 800 B
        be.all_gather(np.zeros(40), np.zeros(10))   # (N-1) shards of 80 B
    assert be.counts["step"]["allreduce"] == {"calls": 1, "bytes": 1200, "nominal": True}
    assert be.counts["step"]["all_gather"] == {"calls": 1, "bytes": 240, "nominal": True}


def test_a_method_without_a_rule_is_refused_not_left_uncounted():
    backend = types.SimpleNamespace(broadcast=lambda buf, root: None)
    with pytest.raises(KeyError, match="'broadcast' has no rule"):
        counting.Counted(backend, 2)
    be = counting.Counted(backend, 2, rules={"broadcast": lambda n, buf, root: _n(buf)})
    be.broadcast(np.zeros(5, np.int32), 0)
    assert be.counts["main"]["broadcast"]["bytes"] == 20


def _n(buf):
    return buf.nbytes


def test_reduce_scatter_and_gather_count_every_block_but_their_own_even_when_uneven():
    be = counting.Counted(types.SimpleNamespace(reduce_scatter=lambda out, inp, counts: None,
                                                all_gather=lambda out, inp, counts: None), 3)
    be.reduce_scatter(np.zeros(2), np.zeros(12), [5, 2, 5])   # rank 1 keeps 2 of 12 items
    be.all_gather(np.zeros(12), np.zeros(2), [5, 2, 5])
    assert be.counts["main"]["reduce_scatter"]["bytes"] == 80 and be.counts["main"]["all_gather"]["bytes"] == 80


def test_an_uneven_all_to_all_needs_the_rank_to_know_which_block_stays():
    backend = types.SimpleNamespace(all_to_all=lambda out, inp, out_counts, inp_counts: None)
    be = counting.Counted(backend, 3, rank=2)
    be.all_to_all(np.zeros(6, np.float32), np.zeros(9, np.float32), [2, 2, 2], [1, 2, 6])
    be.all_to_all(np.zeros(6, np.float32), np.zeros(6, np.float32), [2, 2, 2], [2, 2, 2])
    assert be.counts["main"]["all_to_all"]["bytes"] == 4 * (1 + 2) + 4 * 4
    with pytest.raises(ValueError, match="rank="):
        counting.Counted(backend, 3).all_to_all(np.zeros(6), np.zeros(9), [2, 2, 2], [1, 2, 6])


def test_a_started_transfer_is_counted_when_it_starts_and_its_handle_passes_through():
    log = []

    class Handle:
        def wait(self):
            log.append("wait")
    backend = types.SimpleNamespace(start=lambda sends, recvs: log.append(("start", len(sends))) or Handle())
    be = counting.Counted(backend, 3)
    block, into = np.zeros(6, np.float64), np.zeros(4, np.float64)
    with be.phase("ring"):
        handle = be.start([(block, 1)], [(into, 2)])
    assert be.counts["ring"]["start"] == {"calls": 1, "msgs": 1, "bytes": 48, "recv_bytes": 32, "peers": [1]}
    assert log == [("start", 1)]  # started, not waited: the bytes are counted already
    handle.wait()
    assert log == [("start", 1), "wait"] and be.total(names=["start"]) == 48


def test_started_waits_once_and_keeps_its_buffers_until_then():
    from common import p2p
    done, buf = [], np.zeros(3)
    handle = p2p.Started(lambda: done.append(1), ([(buf, 1)], []))
    assert handle._buffers[0][0][0] is buf
    handle.wait()
    handle.wait()
    assert done == [1] and handle._buffers is None


def test_nccl_start_orders_the_streams_with_events_and_never_blocks_the_host(monkeypatch):
    """The CuPy + NCCL start(), on a stand-in cupy that logs: the communication stream waits for the
    compute stream before the grouped calls; wait() makes the compute stream wait for the group."""
    import sys

    from common import p2p
    log = []

    class Event:
        def __init__(self, where):
            self.where = where

    class Stream:
        def __init__(self, name, non_blocking=False):
            self.name, self.ptr, self.non_blocking = name, 100 + len(name), non_blocking

        def record(self, event=None):
            log.append(("record", self.name))
            return Event(self.name)

        def wait_event(self, event):
            log.append(("wait_event", self.name, event.where))

        def synchronize(self):
            log.append(("HOST SYNC", self.name))
    compute = Stream("compute")
    nccl = types.SimpleNamespace(groupStart=lambda: log.append("groupStart"),
                                 groupEnd=lambda: log.append("groupEnd"), NCCL_FLOAT64=7, NCCL_SUM=0)
    made = []
    cuda = types.SimpleNamespace(get_current_stream=lambda: compute, nccl=nccl,
                                 Stream=lambda non_blocking=False: made.append(Stream("comm", non_blocking))
                                 or made[-1])
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl)
    monkeypatch.setattr(p2p.buffers, "nccl_dtype", lambda buf: 7)

    class Buf:
        size, data = 5, types.SimpleNamespace(ptr=4096)
    comm = types.SimpleNamespace(send=lambda ptr, n, t, peer, s: log.append(("send", peer, s)),
                                 recv=lambda ptr, n, t, peer, s: log.append(("recv", peer, s)))
    be = p2p.nccl_backend(types.SimpleNamespace(nccl=comm, device="gpu", api="mpi4py"))
    handle = be.start([(Buf(), 1)], [(Buf(), 2)])
    side = 100 + len("comm")
    assert log == [("record", "compute"), ("wait_event", "comm", "compute"), "groupStart",
                   ("send", 1, side), ("recv", 2, side), "groupEnd", ("record", "comm")]
    handle.wait()
    assert log[-1] == ("wait_event", "compute", "comm") and not any("HOST SYNC" in e for e in log)
    be.start([(Buf(), 1)], [])
    assert len(made) == 1 and made[0].non_blocking  # one stream, never implicitly ordered with compute
