"""What lesson 13's ring_pass did, in order, written down as it ran: the ring's overlap is graded by
its structure (every step but the last starts the next transfer, computes, then waits: s c w), not by
the clock, as lesson 12 grades its schedules by their ticks; and so is the one buffer rule of an
overlap: a block arriving is never received into memory that is being sent or computed on.

    order = Order(be, att.fold)                  # stands in for the backend and for the compute
    ring_pass(order, kv, sizes, bufs, rank, n, order.fold)
    "".join(order.seen)                          # e.g. "scwscwc" at 3 ranks
    order.clobbered                              # receives that landed in a block in use: 0
"""


def span(buf):
    """(first byte, end) of a contiguous array's memory: torch, NumPy or CuPy."""
    if hasattr(buf, "data_ptr"):  # torch
        start, size = buf.data_ptr(), buf.numel() * buf.element_size()
    elif hasattr(buf, "__array_interface__"):  # numpy
        start, size = buf.__array_interface__["data"][0], buf.nbytes
    else:  # cupy: a device pointer
        start, size = buf.data.ptr, buf.nbytes
    return start, start + size


def overlap(a, b):
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


class Logged:
    """A transfer started through Order.start: its wait() is written down before it runs, and from then
    on its receive buffers may be read."""

    def __init__(self, handle, order):
        self.handle, self.order = handle, order

    def wait(self):
        self.order.seen.append("w")
        self.order.arriving = []
        return self.handle.wait()


class Order:
    """What ring_pass did, in order, graded as lesson 12 grades its schedules (not by the clock): 's' a
    transfer started, 'c' a block computed on, 'w' a transfer waited for. Overlap: every step but the
    last is 's c w' (the next block's transfer in flight while the held one is computed on). clobbered
    counts the sends and computes that read memory a transfer in flight receives into (a race: the
    block may change under them), and the receives that land in memory their own transfer sends."""

    def __init__(self, be, fold):
        self.be, self.inner, self.seen, self.arriving, self.clobbered = be, fold, [], [], 0

    def start(self, sends, recvs):
        self.seen.append("s")
        into = [span(buf) for buf, _ in recvs]
        busy = [span(buf) for buf, _ in sends] + self.arriving  # a receive still in flight counts too
        self.clobbered += sum(overlap(a, b) for a in into for b in busy)
        self.arriving = self.arriving + into
        return Logged(self.be.start(sends, recvs), self)

    def fold(self, block, source):
        self.seen.append("c")
        self.clobbered += sum(overlap(span(block), a) for a in self.arriving)
        self.inner(block, source)
