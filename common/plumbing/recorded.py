"""The backends' calls, each recorded by this rank's flight recorder (common/flight.py).

    be = recorded.wrap(backend)      # p2p.backend(ctx) and collectives.library(ctx) return this
    be.exchange(out, into, dest, source)         # a `sendrecv` slot: started, then completed
    h = be.start(sends, recvs); h.wait()         # a `start` slot, completed when waited for
    be.sync()                                    # on a GPU: the enqueued calls are completed

Collectives are recorded with the buffer every rank passes alike, so that the runner can compare them
rank by rank (common/runner/diagnose.py); point-to-point calls with their peers (`s1 r0`).
"""
from common.buffers import size as _size
from common.flight import get


def _peers(sends, recvs):
    return " ".join([f"s{p}" for b, p in sends if b is not None and _size(b)] +
                    [f"r{p}" for b, p in recvs if b is not None and _size(b)])


def _pair(out, into, dest, source, known={}):
    """_peers of one exchange, from a cache: the hot path of the hand-made rings (lessons 05, 07)."""
    key = (dest, source, out is not None and _size(out) > 0, into is not None and _size(into) > 0)
    text = known.get(key)
    if text is None:
        text = known[key] = " ".join(([f"s{dest}"] if key[2] else []) + ([f"r{source}"] if key[3] else []))
    return text


# how a wrapped backend's method is recorded: name -> (op, kind, (buffer, peers) from its arguments).
# The buffer is one every rank passes alike: all-gather's output, reduce-scatter's input (blocks may be
# uneven); an all-to-all's buffers may differ per rank, so its count is recorded as -1 (not compared)
_CALLS = {
    "exchange": ("sendrecv", "p2p", lambda out, into, dest, source: (out, _pair(out, into, dest, source))),
    "group": ("group", "p2p", lambda sends, recvs: (None, _peers(sends, recvs))),
    "start": ("start", "p2p", lambda sends, recvs: (None, _peers(sends, recvs))),
    "allreduce": ("all_reduce", "coll", lambda buf: (buf, "")),
    "reduce_scatter": ("reduce_scatter", "coll", lambda out, inp, *a, **k: (inp, "")),
    "all_gather": ("all_gather", "coll", lambda out, inp, *a, **k: (out, "")),
    "all_to_all": ("all_to_all", "coll", lambda out, inp, *a, **k: (_Uneven(inp), "")),
}


class _Uneven:
    """A buffer whose dtype is recorded and its count not (-1)."""

    def __init__(self, buf):
        self.dtype, self.size = getattr(buf, "dtype", ""), -1


def wrap(ns):
    """The backend namespace `ns` with each communication method recorded (sync marks GPU work done)."""
    rec = get()
    for name, (op, kind, what) in _CALLS.items():
        if hasattr(ns, name):
            setattr(ns, name, _recorded(rec, getattr(ns, name), op, kind, what, name == "start"))
    if hasattr(ns, "sync"):
        sync = ns.sync
        ns.sync = lambda: (sync(), rec.synced())[0]
    return ns


def _recorded(rec, fn, op, kind, what, returns_handle):
    def call(*args, **kwargs):
        buf, peers = what(*args, **kwargs)
        slot = rec.begin(op, kind, buf, "world", peers=peers)
        out = fn(*args, **kwargs)
        if returns_handle:  # non-blocking: done when waited for
            wait = out.wait
            out.wait = lambda: (wait(), rec.end(slot))[0]
        else:
            rec.end(slot)
        return out
    return call
