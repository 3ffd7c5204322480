"""--debug-collectives: before each recorded collective the ranks of its communicator compare its
fingerprint (#k, op, dtype, count, root, communicator) and stop at the first mismatch instead of
hanging, as TORCH_DISTRIBUTED_DEBUG=DETAIL does for torch alone; here for mpi4py and torch alike.

The fingerprints travel over MPI, point to point among the ranks the call names, on a duplicate of
the world (so they never match a lesson's own messages), non-blocking: a rank that never comes (it
skipped the call, or is in another communicator's) is caught after WAIT_S seconds. Either way
the rank raises CollectiveMismatch, mpi4py ends every rank, and the runner's diagnosis reads the
flight records as after any hang. Cost: 2(N-1) small messages per collective (lesson 14 measures it).
"""
import struct
import time

import numpy as np

WAIT_S = 1.5  # a rank that has not come by then is not coming: stop in under 2 s
FP = struct.Struct("<qqi16s8s24s")  # seq, count, root, op, dtype, comm
TAG = 0x7C0C  # on the checker's own duplicate of the world: no lesson message can match it


class CollectiveMismatch(RuntimeError):
    pass


class Checker:
    """Called by the flight recorder (common/flight.py) before each collective. Collective over
    `comm` when made (it duplicates it)."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.world, self.testall = comm.Dup(), MPI.Request.Testall

    def __call__(self, rec, seq, op, dtype, count, root, comm, members):
        # point-to-point on the duplicate, one tag: between two ranks fingerprints match in order, and a
        # rank that calls on another communicator still sends to the members it names, so they see it
        w, me = self.world, self.world.rank
        group = range(w.size) if comm == "world" else members or \
            [int(x) for x in comm[comm.index("[") + 1:-1].split(",")]
        others = [r for r in group if r != me]
        mine = np.frombuffer(FP.pack(seq, count, root, op.encode(), dtype.encode(), comm.encode()), np.uint8)
        got = np.empty((len(others), FP.size), np.uint8)
        reqs = [w.Isend(mine, dest=r, tag=TAG) for r in others]
        reqs += [w.Irecv(got[i], source=r, tag=TAG) for i, r in enumerate(others)]
        deadline, spins = time.monotonic() + WAIT_S, 0
        while not self.testall(reqs):
            spins += 1
            if spins > 200:  # past a quick spin, sleep a little between tests
                if time.monotonic() > deadline:
                    raise CollectiveMismatch(f"--debug-collectives: not every rank of {comm} came to {op} "
                                             f"#{seq} within {WAIT_S:g} s")
                time.sleep(0.00005)
        prints = dict(zip(others, (FP.unpack(bytes(g)) for g in got)))
        prints[me] = FP.unpack(bytes(mine))
        if len(set(prints.values())) > 1:
            raise CollectiveMismatch(f"--debug-collectives: {comm} #{seq}: " + differ(prints, me))


def differ(prints, me):
    """'rank 2 has count 512 where rank 0 has 1024' for the first field where a rank differs from me."""
    names = ("#", "count", "root", "op", "dtype", "comm")
    order = (5, 3, 0, 4, 1, 2)  # another communicator first: it explains a differing #k too
    mine = prints[me]
    for r, p in sorted(prints.items()):
        for i in order:
            name, a, b = names[i], p[i], mine[i]
            if a != b:
                show = (lambda v: v.rstrip(b"\0").decode()) if isinstance(a, bytes) else str
                return f"rank {r} has {name} {show(a)} where rank {me} has {show(b)}"
    return "fingerprints differ"
