"""--debug-collectives: before each recorded collective the ranks of its communicator compare its
fingerprint (#k, op, dtype, count, root, communicator) and stop at the first mismatch instead of
hanging, as TORCH_DISTRIBUTED_DEBUG=DETAIL does for torch alone; here for mpi4py and torch alike.

The fingerprints travel over MPI, point to point among the ranks the call names, on a duplicate of
the world (so they never match a lesson's own messages), non-blocking. A fingerprint that differs
stops the run at once. A rank that has not come is slow, not stuck, until its flight record says
otherwise (lesson 14): every WAIT_S the waiting rank reads the absent rank's record in the run folder,
and stops only when that rank waits in another call, nothing moving, or is gone. Without a record to
read (a run by hand, another node's), it waits ALONE_WAIT_S. Either way the rank raises
CollectiveMismatch naming the lesson's line, mpi4py ends every rank, and the runner's diagnosis reads
the flight records as after any hang. Cost: 2(N-1) small messages per collective (lesson 14 measures it).
"""
import os
import struct
import sys
import time
import types

import numpy as np

from common import flight
from common.plumbing import run_folder

WAIT_S = 1.5        # how often an absent rank's record is read: one waiting elsewhere stops the run then
ALONE_WAIT_S = 30.0  # with no record to read, the wait before a rank that has not come is called stuck
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
        start = time.monotonic()
        deadline, spins, seen = start + WAIT_S, 0, {}
        while not self.testall(reqs):
            spins += 1
            if spins > 200:  # past a quick spin, sleep a little between tests
                if time.monotonic() > deadline:
                    absent = [r for r, q in zip(others, reqs[len(others):]) if q]  # a done request is null
                    why = stuck(absent, seen, time.monotonic() - start)
                    if why:
                        raise at_call(f"--debug-collectives: {comm} {op} #{seq}: {why}")
                    deadline = time.monotonic() + WAIT_S
                time.sleep(0.00005)
        prints = dict(zip(others, (FP.unpack(bytes(g)) for g in got)))
        prints[me] = FP.unpack(bytes(mine))
        if len(set(prints.values())) > 1:
            raise at_call(f"--debug-collectives: {comm} #{seq}: " + differ(prints, me))


def stuck(absent, seen, waited):
    """Why the absent ranks are not coming (one line), or None while one may still come (slow, not
    stuck). seen: {rank: its record's write count when last read}, kept between calls."""
    run_dir = run_folder.given()
    for r in absent:
        head, entries = None, []
        if run_dir:
            try:
                with open(run_folder.rank_file(run_dir, r, "flight"), "rb") as f:
                    head, entries = flight.parse(f.read())
            except OSError:
                pass
        if head is None:  # nothing to read: only the clock can tell
            if waited >= ALONE_WAIT_S:
                return (f"rank {r} has not come within {ALONE_WAIT_S:g} s (no flight record here to tell "
                        "slow from stuck)")
            continue
        if not _alive(head["pid"]):
            return f"rank {r} has not come, and its process is gone"
        last = max(entries, key=lambda e: e["t0"]) if entries else None
        still = seen.get(r) == head["writes"]
        seen[r] = head["writes"]
        if still and last and last["state"] == "started":  # waiting in another call, nothing moving
            where = f", {last['site']}" if last["site"] else ""
            return (f"rank {r} has not come: it waits in {last['op']} #{last['seq']} on {last['comm']}"
                    f"{where}")
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:  # a zombie has exited: it runs nothing more
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def at_call(message):
    """CollectiveMismatch whose innermost traceback entry is the lesson's line that made the call (the
    first frame outside common/), so the traceback and the runner's `rank R failed: ... (file:line)`
    name it, not this file. The frames between stay above it, as Python prints them."""
    exc = CollectiveMismatch(message)
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) in flight.KIT:
        f = f.f_back
    if f is not None:
        exc.__traceback__ = types.TracebackType(None, f, f.f_lasti, f.f_lineno)
    return exc


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
