"""Lesson 11's three collectives, counted and tallied: the adapter between its four ways and the
collectives they call, by hand (lesson 05's ring all-reduce and lesson 09's all-gather and
reduce-scatter, on common/p2p) or the library's.

    ops = Collectives(ctx, dtype, five, nine)                  # by hand: five, nine = lessons 05, 09
    lib = Collectives(ctx, dtype, five, nine, library=True)     # the library's calls
    with ops.phase("forward"):
        z = ops.all_reduce(part, "z (g)")                       # tallied as ("all_reduce", "z (g)")
    ops.be.total(phases=["forward"])                            # bytes this rank sent (common/counting)
    ops.calls                                                   # {phase: [(call, what it moved)]}

The page passes its lessons in (five, nine): a module here never imports its page.
"""
import contextlib
import types

from common import buffers, collectives, counting, p2p, shards


class Collectives:
    """The three collectives the ways call. By hand: lesson 05's ring all-reduce and lesson 09's
    all-gather and reduce-scatter on common/p2p; or the library's (library=True). Bytes are counted
    per pass by common/counting; every call is tallied here by name and by what it moved."""

    def __init__(self, ctx, dtype, five, nine, library=False):
        self.ctx, self.n, self.rank, self.dtype, self.library = ctx, ctx.world_size, ctx.rank, dtype, library
        self.five, self.nine = five, nine
        if library:
            lib, be = collectives.library(ctx), p2p.backend(ctx)
            self.names = dict(lib.names, all_reduce=collectives.ALLREDUCE_NAME[ctx.transport])
            self.missing = lib.missing  # {call: what stands in for it on this library}
            raw = types.SimpleNamespace(all_gather=lib.all_gather, reduce_scatter=lib.reduce_scatter,
                                        allreduce=be.allreduce, sync=lib.sync)
        else:
            raw = p2p.backend(ctx)  # exchange: Sendrecv / ncclSend+Recv / batch_isend_irecv
        self.be = counting.Counted(raw, self.n)
        self.calls, self.now = {}, "main"

    @contextlib.contextmanager
    def phase(self, name):
        self.now = name
        with self.be.phase(name):
            yield

    def _tally(self, name, what):
        self.calls.setdefault(self.now, []).append((name, what))

    def called(self, phase):
        """The calls of one phase, by name, in the order they ran: 'all_gather reduce_scatter'."""
        return " ".join(name for name, _ in self.calls.get(phase, []))

    def empty(self, count):
        return buffers.empty(self.ctx, count, self.dtype)

    def all_reduce(self, buf, what):
        """The sum over ranks of buf (a new array, same shape). By hand: lesson 05's ring on chunks of
        whole rows (tokens), labelled as lesson 09's halves: its reduce-scatter leaves rank r the sum
        of its own tokens, then its all-gather spreads them, so it sends what (3)'s pair sends."""
        self._tally("all_reduce", what)
        out = self.empty(buffers.size(buf))
        out[:] = buf.reshape(-1)  # a copy: the ring adds in place, and buf may be a caller's input
        if self.library:
            self.be.allreduce(out)
        else:
            rows = buf.shape[0]
            per_row = buffers.size(buf) // rows if rows else 0
            counts = [(hi - lo) * per_row for lo, hi in shards.chunk_bounds(rows, self.n)]
            scratch = self.empty(max(counts))
            self.five.ring_allreduce(out, scratch, self.nine.ring_chunks(counts, self.n), self.rank,
                                     self.n, self.be.exchange, self.five.inplace_add)
        return out.reshape(buf.shape)

    def all_gather(self, mine, counts, what):
        """Every rank's `mine` (counts[r] items from rank r), in rank order, as one vector."""
        self._tally("all_gather", what)
        out = self.empty(sum(counts))
        if self.library:
            self.be.all_gather(out, mine.reshape(-1), counts)
        else:
            self.nine.all_gather(self.be, mine.reshape(-1), out, counts, self.rank, self.n)
        return out

    def reduce_scatter(self, full, counts, what):
        """The sum over ranks of block `rank` of the vector `full` (counts[r] items in block r)."""
        self._tally("reduce_scatter", what)
        out = self.empty(counts[self.rank])
        if self.library:
            self.be.reduce_scatter(out, full.reshape(-1), counts)
        else:
            self.nine.reduce_scatter(self.be, full.reshape(-1), out, counts, self.rank, self.n)
        return out
