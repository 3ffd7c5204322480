"""What lesson 13's ring_pass did, in order, written down as it ran: the ring's overlap is graded by
its structure (every step but the last starts the next transfer, computes, then waits: s c w), not by
the clock, as lesson 12 grades its schedules by their ticks.

    order = Order(be, att.fold)                  # stands in for the backend and for the compute
    ring_pass(order, kv, sizes, bufs, rank, n, order.fold)
    "".join(order.seen)                          # e.g. "scwscwc" at 3 ranks
"""


class Logged:
    """A transfer started through Order.start: its wait() is written down before it runs."""

    def __init__(self, handle, order):
        self.handle, self.order = handle, order

    def wait(self):
        self.order.append("w")
        return self.handle.wait()


class Order:
    """What ring_pass did, in order, graded as lesson 12 grades its schedules (not by the clock): 's' a
    transfer started, 'c' a block computed on, 'w' a transfer waited for. Overlap: every step but the
    last is 's c w' (the next block's transfer in flight while the held one is computed on)."""

    def __init__(self, be, fold):
        self.be, self.inner, self.seen = be, fold, []

    def start(self, sends, recvs):
        self.seen.append("s")
        return Logged(self.be.start(sends, recvs), self.seen)

    def fold(self, block, source):
        self.seen.append("c")
        self.inner(block, source)
