"""Lesson 01's watchers: a wait with a deadline, a communicator that buffers nothing, and another
library's send and receive under MPI's names, so that one exercise runs on MPI, torch and NCCL."""
import time

from common import timing


def wait_until(done, seconds):
    """Poll done() until it is true or the deadline passes; True if it completed."""
    left = timing.deadline(seconds)
    while left() > 0:
        if done():
            return True
        time.sleep(0.002)  # yield the core: on a loaded machine the peers need it
    return bool(done())


def deadlock(rank, call, seconds):
    """The error a blocking call that waited `seconds` for its partner stops the run with."""
    return RuntimeError(
        f"deadlock: rank {rank}'s {call} waited {seconds:g} s for a matching call that never came. "
        "A send may wait for its receive (MPI may, gloo does): did every rank send first (or receive "
        "first), or do the partners not match?")


class Unbuffered:
    """A communicator that buffers nothing, as the MPI standard allows: Send behaves as Ssend (it
    returns once its receive has started), whatever the size. Each blocking call waits with a
    deadline, so a cycle of waits stops every rank with one clear error instead of hanging."""

    def __init__(self, comm, seconds):
        self.comm, self.seconds = comm, seconds
        self.rank, self.size = comm.rank, comm.size

    def __getattr__(self, name):  # anything else (Sendrecv, Get_rank, Isend ...) is the real call
        return getattr(self.comm, name)

    def _wait(self, req, call):
        if not wait_until(req.Test, self.seconds):
            raise deadlock(self.rank, call, self.seconds)

    def Send(self, buf, dest, tag=0):
        self._wait(self.comm.Issend(buf, dest=dest, tag=tag), f"Send(dest={dest})")

    Ssend = Send

    def Recv(self, buf, source, tag=0, status=None):
        self._wait(self.comm.Irecv(buf, source=source, tag=tag), f"Recv(source={source})")


class InMpiWords:
    """Another library's blocking send and receive under MPI's names, so the NCCL and torch paths
    run the exercise's own parity_mpi: the parity logic is written once, in the exercise."""

    def __init__(self, rank, size, send, recv):
        self.rank, self.size, self._send, self._recv = rank, size, send, recv

    def Ssend(self, buf, dest, tag=0):
        self._send(buf, dest)

    Send = Ssend

    def Recv(self, buf, source, tag=0, status=None):
        self._recv(buf, source)
