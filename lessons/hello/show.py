"""What lesson 00 prints: who each rank is, the nodes, and the halves."""
import os

from common import report, text


def listed(ranks):
    """'0, 1' or '0..31': a node's ranks in a few characters."""
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


def who_am_i(ctx, my_id, node_ranks, distinct):
    """The device, each rank's ids, one line per node, and how many distinct ids. Collective."""
    if ctx.rank == 0:
        print(text.wrapped(f"device: {ctx.why}"), flush=True)
    # what differs per process, then what ranks may share (say prints a line alike on all ranks once)
    report.say(ctx, f"id {my_id}  local_rank {ctx.local_rank} of {ctx.local_size}  pid {os.getpid()}\n"
                    f"host {ctx.host}  device {ctx.device}  transport {ctx.transport}")
    nodes = ctx.comm.gather((ctx.host, node_ranks), root=0)
    if ctx.rank == 0:  # one line per node, in the order of its first rank
        for host, ranks in sorted(set((h, tuple(r)) for h, r in nodes), key=lambda x: x[1]):
            print(text.fit(f"node {host}: ranks {listed(ranks)} share its memory"), flush=True)
        print(f"{distinct} distinct ids in 0..{ctx.world_size - 1} among {ctx.world_size} processes", flush=True)


def halves(ctx, m):
    """Section 3's title: where the world is cut."""
    n = ctx.world_size
    report.section(ctx, f"3. split the world: ranks 0..{m - 1} are half 0, ranks {m}..{n - 1} half 1"
                   if n > 1 else "3. split the world: with 1 rank, half 1 is empty")


def my_half(ctx, half, sub_rank, half_sum, want, steps):
    """Each rank's half, its id there, and its half's sum (after the NCCL handshake, on a GPU)."""
    if steps:
        report.say(ctx, "NCCL handshake for my half: " + "\n  then ".join(steps))
    report.say(ctx, f"half {half}: id {sub_rank} in my half; sum of my half's world ranks = {half_sum}"
                    f"  (want {want})")
