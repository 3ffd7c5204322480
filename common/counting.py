"""One counting communicator: wrap a backend, and every call this rank makes through it is counted.

    be = counting.Counted(p2p.backend(ctx), ctx.world_size)
    with be.phase("forward"):                 # a lesson's own labels; calls outside any phase: "main"
        be.group([(chunk, right)], [(into, left)])
    report.finish(ctx, {"comm": be.counts})   # per rank, in the results JSON, for YAML checks:
    # {"forward": {"group": {"calls": 1, "msgs": 1, "bytes": 4096, "recv_bytes": 4096, "peers": [1]}}}

Two kinds of count, never mixed in one entry:
  * point-to-point (exchange, group, start, send, recv): `bytes` is what this rank really handed to the
    network, `msgs` the non-empty sends, `peers` every rank it sent to. Hand-made collectives are graded
    on these. A non-blocking start(sends, recvs) is counted when it is started (its wait() is not a
    call of the backend: it is the handle start returned, passed through as it is).
  * a library collective (allreduce, all_gather, ...): the library does not say what its algorithm
    sent, so `bytes` is what the bandwidth-optimal (ring) algorithm sends per rank for these buffers,
    the volume nccl-tests' busbw assumes: reduce-scatter every block of its input but its own,
    all-gather every block of its output but its own (N-1 shards when they are equal), all-to-all every
    block but the one it keeps (its own rank's: pass rank= for uneven split sizes), all-reduce 2(N-1)/N
    of the buffer. `nominal: true` marks these entries.

A backend method with no rule is refused when it is wrapped (never silently left uncounted): pass
`rules={"name": fn}` where fn(n, *args, **kwargs) returns the bytes this rank sends, or list it in
`quiet` (local work such as sync). Counting costs a few Python operations per call.
"""
import contextlib

from common import buffers


def _nb(buf):
    return buffers.nbytes(buf) if buf is not None and buffers.size(buf) > 0 else 0


def _sends_exchange(out, into, dest, source):
    return [(out, dest)], [(into, source)]


def _sends_group(sends, recvs):
    return list(sends), list(recvs)


def _sends_send(buf, dest):
    return [(buf, dest)], []


def _sends_recv(buf, source):
    return [], [(buf, source)]


# point-to-point: method -> its (sends, recvs) as (buffer, peer) pairs
P2P = {"exchange": _sends_exchange, "group": _sends_group, "start": _sends_group, "send": _sends_send,
       "recv": _sends_recv}

def _all_to_all(rank):
    """all_to_all(out, inp, out_counts=None, inp_counts=None): inp less the block this rank keeps."""
    def rule(n, out, inp, out_counts=None, inp_counts=None, *a, **k):
        if inp_counts is None or len(set(inp_counts)) <= 1:
            return (n - 1) * _nb(inp) // n
        if rank is None:
            raise ValueError("counting: an all_to_all with uneven split sizes needs Counted(..., rank=)")
        return _nb(inp) - _nb(inp) // max(sum(inp_counts), 1) * inp_counts[rank]
    return rule


# library collectives: method -> bytes the ring algorithm sends from this rank (n ranks); the first
# argument is the output buffer, the second the input, as in torch.distributed's calls. Exact for
# uneven blocks too: a rank never sends the block it keeps (reduce-scatter) or already holds (gather)
COLLECTIVES = {
    "allreduce": lambda n, buf, *a, **k: 2 * (n - 1) * _nb(buf) // n,
    "all_gather": lambda n, out, inp, *a, **k: _nb(out) - _nb(inp),
    "reduce_scatter": lambda n, out, inp, *a, **k: _nb(inp) - _nb(out),
}
QUIET = ("sync",)


class Counted:
    """A backend whose every call is counted per phase; attributes without a rule are refused."""

    def __init__(self, backend, n, rules=None, quiet=QUIET, rank=None):
        self.n, self.counts, self._phases = n, {}, ["main"]
        extra = dict(rules or {})
        builtin = dict(COLLECTIVES, all_to_all=_all_to_all(rank))
        for name in dir(backend):
            fn = getattr(backend, name)
            if name.startswith("_") or not callable(fn):
                continue
            if name in quiet:
                wrapped = fn
            elif name in P2P:
                wrapped = self._p2p(name, fn)
            elif name in extra or name in builtin:
                wrapped = self._collective(name, fn, extra.get(name, builtin.get(name)))
            else:
                raise KeyError(f"counting: backend method {name!r} has no rule: pass rules={{{name!r}: "
                               "fn(n, *args) -> bytes sent}} or list it in quiet")
            setattr(self, name, wrapped)

    @contextlib.contextmanager
    def phase(self, label):
        """Calls made inside are counted under `label` (the innermost phase wins)."""
        self._phases.append(label)
        try:
            yield self
        finally:
            self._phases.pop()

    def _entry(self, name, **fields):
        entry = self.counts.setdefault(self._phases[-1], {}).setdefault(name, {"calls": 0, **fields})
        entry["calls"] += 1
        return entry

    def _p2p(self, name, fn):
        split = P2P[name]

        def call(*args, **kwargs):
            sends, recvs = split(*args, **kwargs)
            e = self._entry(name, msgs=0, bytes=0, recv_bytes=0, peers=[])
            for buf, peer in sends:
                if _nb(buf):
                    e["msgs"] += 1
                    e["bytes"] += _nb(buf)
                    if peer not in e["peers"]:
                        e["peers"] = sorted(e["peers"] + [peer])
            e["recv_bytes"] += sum(_nb(buf) for buf, _ in recvs)
            return fn(*args, **kwargs)
        return call

    def _collective(self, name, fn, rule):
        def call(*args, **kwargs):
            e = self._entry(name, bytes=0, nominal=True)
            e["bytes"] += int(rule(self.n, *args, **kwargs))
            return fn(*args, **kwargs)
        return call

    def total(self, phases=None, names=None, field="bytes"):
        """Sum of `field` over the chosen phases and methods (all when None)."""
        return sum(e.get(field, 0) for ph, calls in self.counts.items() if phases is None or ph in phases
                   for name, e in calls.items() if names is None or name in names)
