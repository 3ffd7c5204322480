"""Streams and events of the GPU double: NCCL's work waits in a queue per stream until it is needed.

CuPy's own operations run at once, on the host. Every NCCL call is queued on the stream whose .ptr it
was given (0: the null stream), and a stream's queue runs, in order, only when
  * the stream is synchronized: stream.synchronize(), .synchronize() of an event recorded on it after
    the call, Device().synchronize() or runtime.deviceSynchronize() (every stream);
  * a CuPy operation is issued on it (a kernel runs after the NCCL work queued before it), or on a
    stream ordered after it (wait_event; the legacy null stream and streams made with
    non_blocking=False wait for each other's earlier work);
  * stream.done or event.done is polled: the double runs the work, then answers True.
A host read (x.get(), cupy.asnumpy(x), int(x[0])) runs nothing: read before a sync, you see the old
contents. This is stricter than CuPy, whose get() syncs its own stream: the kit's rule is "sync before
the host reads", and the double holds the lessons to it. Running queued NCCL work may block in MPI
until the peers run theirs, where a GPU would only have queued a kernel behind it.
"""
import itertools
import threading
from collections import deque

from cupy.cuda.memory import DoubleFault

_seq = itertools.count(1)       # one number per piece of work issued anywhere: the order of issue
_handles = itertools.count(1)
_streams = {}                   # ptr -> Stream (streams are never freed in the double)
_local = threading.local()


class Stream:
    """cupy.cuda.Stream: .ptr, synchronize(), done, record(), wait_event(), `with stream:`."""
    null = None

    def __new__(cls, null=False, non_blocking=False, ptds=False):
        return cls.null if null and cls.null is not None else super().__new__(cls)

    def __init__(self, null=False, non_blocking=False, ptds=False):
        if hasattr(self, "ptr"):
            return
        if ptds:
            raise NotImplementedError("GPU double: per-thread default streams are not simulated")
        self.ptr = 0 if null else 0x7d0000 + 0x100 * next(_handles)
        self.non_blocking = bool(non_blocking)
        self.queue = deque()          # (number, work) of NCCL calls not yet run
        self.issued = 0               # number of the last work issued here
        self.done_upto = 0            # the host saw all work here up to this number finish
        self.clock = {}               # stream -> number: work there this stream was made to wait for
        _streams[self.ptr] = self

    @property
    def legacy(self):
        """The null stream and blocking streams wait for each other (CUDA's legacy default stream)."""
        return self.ptr == 0 or not self.non_blocking

    def __repr__(self):
        if self.ptr == 0:
            return "the null stream"
        return f"stream 0x{self.ptr:x}" + (" (non_blocking)" if self.non_blocking else "")

    def synchronize(self):
        run_until(self, self.issued)
        self.done_upto = self.issued

    @property
    def done(self):
        """The double runs the queued work when polled, then says True."""
        self.synchronize()
        return True

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        if event.stream is None:
            return
        source, upto = event.stream, event.seq
        enqueue(self, lambda: run_until(source, upto, peers=True))
        for stream, n in event.clock.items():
            self.clock[stream] = max(self.clock.get(stream, 0), n)

    def use(self):
        _local.current = self
        return self

    def __enter__(self):
        _local.__dict__.setdefault("stack", []).append(self)
        return self

    def __exit__(self, *exc):
        _local.stack.pop()


Stream.null = Stream(null=True)


class Event:
    """cupy.cuda.Event: record(stream=None), synchronize(), done."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.stream, self.seq, self.clock = None, 0, {}

    def record(self, stream=None):
        stream = stream or get_current_stream()
        self.stream, self.seq = stream, stream.issued
        self.clock = {**stream.clock, stream: stream.issued}

    def synchronize(self):
        if self.stream is not None:
            run_until(self.stream, self.seq, peers=True)
            self.stream.done_upto = max(self.stream.done_upto, self.seq)

    @property
    def done(self):
        """The double runs the work before the event when polled, then says True."""
        self.synchronize()
        return True


def get_current_stream(device_id=-1):
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else getattr(_local, "current", Stream.null)


def from_ptr(ptr):
    return _streams.get(ptr)


def enqueue(stream, work):
    n = stream.issued = next(_seq)
    stream.queue.append((n, work))
    return n


def _peers(stream):
    """Streams whose earlier work `stream`'s work waits for under the legacy default-stream rules."""
    if not stream.legacy:
        return []
    if stream.ptr == 0:
        return [s for s in list(_streams.values()) if s.legacy and s is not stream]
    return [Stream.null]


def run_until(stream, upto, peers=False):
    """Run `stream`'s queued work numbered <= upto, in order, each after what it waits for."""
    for other in _peers(stream) if peers else ():
        run_until(other, upto)
    while stream.queue and stream.queue[0][0] <= upto:
        n, work = stream.queue.popleft()
        for other in _peers(stream):
            run_until(other, n - 1)
        work()


def kernel():
    """A CuPy operation on the current stream: run the NCCL work it comes after; (stream, number)."""
    stream = get_current_stream()
    n = next(_seq)
    run_until(stream, n, peers=True)
    stream.issued = n
    return stream, n


def synchronize_all():
    """Device-wide sync: every stream's queue, in the order the work was issued."""
    while True:
        pending = [s for s in list(_streams.values()) if s.queue]
        if not pending:
            break
        first = min(pending, key=lambda s: s.queue[0][0])
        run_until(first, first.queue[0][0])
    for s in _streams.values():
        s.done_upto = s.issued


def check_order(stream, alloc, call):
    """Raise if NCCL on `stream` would use `alloc` while its last write, on another stream, may race."""
    writer, n = alloc.stream, alloc.seq
    if writer is None or writer is stream or n <= writer.done_upto or stream.clock.get(writer, 0) >= n:
        return
    if stream.legacy and writer.legacy and 0 in (stream.ptr, writer.ptr):
        return
    raise DoubleFault(f"{call}: a buffer written on {writer!r}, used by NCCL on {stream!r} without waiting "
                      f"for it (e = writer.record(); nccl_stream.wait_event(e), or sync the writer first)")
