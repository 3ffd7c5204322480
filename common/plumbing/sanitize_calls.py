"""The calls --sanitize wraps (common/sanitize.py holds the checks): mpi4py's and torch.distributed's.

    c = sanitize_calls.comm(ctx.comm)         # Isend / Issend / Irecv / Send / Ssend / Recv sanitized
    sanitize_calls.patch_torch(ctx.comm)      # isend, irecv, send, recv, P2POp, batch_isend_irecv

Every sanitized call joins the rank's simulated stream (sanitize.Sanitizer.flush) as NCCL runs it:
ungrouped calls in their order, a send done only once its receive was posted; a group starts
together. A group is what batch_isend_irecv posts, or the requests one Waitall / Testall / Waitany
/ Testany is given. mpi4py: a send is posted as Issend (synchronous mode: done once matched).
torch (gloo completes small sends on its own): the receiver sends a token over a duplicate of the
MPI world as its receive is posted; the send is posted once that token came. A receive from any
source (torch) sends no token: a send to it is not ordered (the rule cannot match it). Every other
call on the comm or on torch.distributed first lets the stream move (never waiting); Sendrecv waits
for the stream to empty, then runs as it is.
"""
import mmap
import threading
import time

import numpy as np

from common import sanitize

_ORIG = {}  # what was replaced: "Comm" (the sanitized class), "Request", "torch" ({name: function})


def _like(buf):
    """A fresh C-ordered buffer like `buf` (mpi4py's [buf, type ...] form kept, its array replaced)."""
    if isinstance(buf, (list, tuple)):
        return type(buf)([_like(buf[0]), *buf[1:]])
    if hasattr(buf, "data_ptr"):
        import torch
        return torch.empty_like(buf, memory_format=torch.contiguous_format)
    a = sanitize.array(buf)  # anonymous memory: outside tracemalloc's count, so a lesson's peaks stay its own
    return np.frombuffer(mmap.mmap(-1, a.nbytes), a.dtype).reshape(a.shape)


def _arg(a, k, name, at, default):
    return k[name] if name in k else a[at] if len(a) > at else default


# ---------------------------------------------------------------- mpi4py
def comm(c):
    """c (an mpi4py Intracomm) with its point-to-point calls sanitized and every other call letting the
    stream move first; MPI.Request's Waitall and friends learn its requests."""
    from mpi4py import MPI
    if "Comm" not in _ORIG:
        _ORIG["Comm"] = _comm_class(MPI)
        _ORIG["Request"] = MPI.Request
        MPI.Request = _requests_class(MPI.Request)
    return _ORIG["Comm"](c)


def _comm_class(MPI):
    base, ns = MPI.Intracomm, {}

    def flushing(name):
        def call(self, *args, **kwargs):
            sanitize.flush()
            return getattr(super(cls, self), name)(*args, **kwargs)
        return call
    for name in dir(base):
        if not name.startswith("_") and callable(getattr(base, name)) and not isinstance(getattr(base, name), type):
            ns[name] = flushing(name)

    def send(c, buf, a, k, op):
        peer, tag = _arg(a, k, "dest", 0, None), _arg(a, k, "tag", 1, 0)
        post = lambda b: base.Issend(c, b, *a, **k)  # noqa: E731 (done once matched: NCCL's send)
        return sanitize.active().send(buf, post, peer, tag, lambda r: r.Test(), op)

    def recv(c, buf, a, k, op):
        peer, tag = _arg(a, k, "source", 0, MPI.ANY_SOURCE), _arg(a, k, "tag", 1, MPI.ANY_TAG)
        status = _arg(a, k, "status", 2, None)
        post = lambda b: base.Irecv(c, b, peer, tag)  # noqa: E731
        return sanitize.active().recv(buf, post, _like, peer, tag, lambda r: r.Test(status), op)

    def wrapped(name, fn, blocking):
        def call(self, buf, *a, **k):
            san = sanitize.active()
            p = fn(self, buf, a, k, name.lower()) if san else None
            if p is None:
                return getattr(base, name)(self, buf, *a, **k)
            if blocking:
                return san.wait([p])
            return _request(san, p)
        return call
    for name, fn, blocking in (("Isend", send, False), ("Issend", send, False), ("Irecv", recv, False),
                               ("Send", send, True), ("Ssend", send, True), ("Recv", recv, True)):
        ns[name] = wrapped(name, fn, blocking)

    def sendrecv(self, *a, **k):
        san = sanitize.active()
        if san is not None:
            san.drain()  # a group of its own, behind what the stream holds
        return base.Sendrecv(self, *a, **k)
    ns["Sendrecv"] = sendrecv
    cls = type("SanitizedComm", (base,), ns)
    return cls


def _request(san, p):
    r = _req_class()()  # an MPI.Request (null to MPI itself): every wait and test goes through it
    r.san, r.p = san, p
    return r


def _req_class():
    if "Req" not in _ORIG:
        class Req(_ORIG["Request"]):
            """A sanitized request: its wait (or a test that says done) checks and delivers."""

            def __bool__(self):
                return not self.p.done

            def Wait(self, status=None):
                self.san.wait([self.p])
                return True

            def Test(self, status=None):
                return self.san.test([self.p])
        _ORIG["Req"] = Req
    return _ORIG["Req"]


def _requests_class(orig):
    """MPI.Request, whose Waitall / Testall / Waitany / Testany take sanitized requests too: the
    sanitized ones given together are one group."""
    def split(requests):
        mine = [r for r in requests if isinstance(r, _ORIG.get("Req", ()))]
        others = [r for r in requests if r is not None and r not in mine]
        return mine, others, [r.p for r in mine]

    class Request(orig):
        @classmethod
        def Waitall(cls, requests, statuses=None):
            mine, others, ps = split(requests)
            if ps:
                mine[0].san.wait(ps, group=True)
            return orig.Waitall(others, statuses) if others or not ps else True

        @classmethod
        def Testall(cls, requests, statuses=None):
            mine, others, ps = split(requests)
            done = mine[0].san.test(ps, group=True) if ps else True
            return orig.Testall(others, statuses) and done if others else done

        @classmethod
        def Waitany(cls, requests, status=None):
            mine, others, ps = split(requests)
            if not ps:
                return orig.Waitany(requests, status)
            while True:
                i, done = cls.Testany(requests, status)
                if done or all(r.p.done for r in mine) and not others:
                    return i
                mine[0].san.idle()

        @classmethod
        def Testany(cls, requests, status=None):
            from mpi4py import MPI
            mine, others, ps = split(requests)
            if not ps:
                return orig.Testany(requests, status)
            mine[0].san.group(ps)
            for i, r in enumerate(requests):
                if r in mine and not r.p.done and r.san.test([r.p]):
                    return i, True
                if r is not None and r not in mine and r.Test(status):
                    return i, True
            return MPI.UNDEFINED, all(r.p.done for r in mine) and not others
    return Request


# ---------------------------------------------------------------- torch.distributed
FLUSHING = ("barrier", "monitored_barrier", "all_reduce", "broadcast", "reduce", "gather", "scatter", "all_gather",
            "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
            "reduce_scatter_single", "all_to_all", "all_to_all_single", "all_gather_object", "broadcast_object_list",
            "gather_object", "scatter_object_list", "new_group", "destroy_process_group")


class Work:
    """A sanitized torch Work: wait() (or is_completed() once true) checks and delivers."""

    def __init__(self, san, p):
        self.san, self.p = san, p

    def wait(self, *args, **kwargs):
        self.san.wait([self.p])
        return True

    def is_completed(self):
        return self.san.test([self.p])

    def __getattr__(self, name):
        self.san.flush()
        return getattr(self.p.real, name)


class _TokenSend:
    """A torch send in NCCL's order: posted once the receiver's token said its receive is posted; then
    a token back says the send is posted (gloo's is_completed() stays False until a wait). A thread
    polls the tokens, as a GPU's stream moves while its host is in another call."""
    waiting, lock, thread = [], threading.Lock(), []

    def __init__(self, hs, isend, tensor, peer, tag, a, k):
        self.hs, self.peer, self.tag = hs, peer, tag % 32768
        self.isend, self.tensor, self.a, self.k, self.work, self.released = isend, tensor, a, k, None, False
        with self.lock:
            self.token = hs[0].Irecv(np.empty(1, np.uint8), source=peer, tag=self.tag)
            self.waiting.append(self)
        if not self.thread:
            self.thread.append(threading.Thread(target=self.polls, daemon=True))
            self.thread[0].start()

    @classmethod
    def polls(cls):
        while True:
            with cls.lock:
                cls.advance()
            time.sleep(0.0005)

    @classmethod
    def advance(cls):
        """Post every send whose token came, in the order they were made: gloo, as NCCL, matches the
        sends to one peer with one tag to that peer's receives in order, so a later send must never go
        before an earlier one (a test() of the later one alone did: sizes crossed, lesson 07's dbt)."""
        held, left = set(), []
        for s in cls.waiting:
            if (s.peer, s.tag) in held or not s.poll():
                held.add((s.peer, s.tag))
                left.append(s)
        cls.waiting[:] = left

    def poll(self):
        if self.released:
            return True
        if self.work is None and self.token.Test():
            self.work = self.isend(self.tensor, *self.a, **self.k)
            self.hs[1].Isend(np.zeros(1, np.uint8), dest=self.peer, tag=self.tag).Wait()  # eager: 1 byte
        return self.work is not None

    def test(self):
        with self.lock:
            self.advance()
            if self.work is None:
                return False
        self.work.wait()  # its receive is posted: done soon
        return True

    def release(self):
        """Waited: drop the tensor and gloo's Work, which holds it (a buffer the learner dropped is freed)."""
        with self.lock:
            self.released, self.work, self.tensor = True, None, None


class _TokenRecv:
    """A torch receive in NCCL's order: its token told the sender; done once the sender's token says
    the send is posted (a receive from any source: waited as it is)."""

    def __init__(self, hs, work, peer, tag):
        self.work, self.sent = work, None
        if peer is not None:
            hs[0].Isend(np.zeros(1, np.uint8), dest=peer, tag=tag % 32768).Wait()  # eager: 1 byte
            self.sent = hs[1].Irecv(np.empty(1, np.uint8), source=peer, tag=tag % 32768)

    def test(self):
        if self.sent is not None and not self.sent.Test():
            return False
        self.work.wait()
        return True

    def release(self):
        self.work = None


def patch_torch(world):
    """torch.distributed's point-to-point calls sanitized (when a Sanitizer is active), its others made
    to let the stream move first. world: an mpi4py comm over the same ranks (duplicated: the tokens)."""
    import torch.distributed as dist
    if "torch" in _ORIG:
        return
    real = _ORIG["torch"] = {n: getattr(dist, n) for n in ("isend", "irecv", "batch_isend_irecv", "P2POp")}
    hs = (world.Dup(), world.Dup())  # tokens: a receive is posted; a send is posted

    def isend(tensor, *a, op="isend", **k):
        san, peer, tag = sanitize.active(), _arg(a, k, "dst", 0, None), _arg(a, k, "tag", 2, 0)
        if san is None or peer is None:
            return real["isend"](tensor, *a, **k)
        p = san.send(tensor, lambda t: _TokenSend(hs, real["isend"], t, peer, tag, a, k), peer, tag,
                     lambda s: s.test(), op)
        return Work(san, p) if p else real["isend"](tensor, *a, **k)

    def irecv(tensor, *a, op="irecv", **k):
        san, peer, tag = sanitize.active(), _arg(a, k, "src", 0, None), _arg(a, k, "tag", 2, 0)
        if san is None:
            return real["irecv"](tensor, *a, **k)

        post = lambda t: _TokenRecv(hs, real["irecv"](t, *a, **k), peer, tag)  # noqa: E731
        p = san.recv(tensor, post, _like, -1 if peer is None else peer, tag, lambda r: r.test(), op)
        return Work(san, p) if p else real["irecv"](tensor, *a, **k)
    ops = {isend: real["isend"], irecv: real["irecv"]}

    def send(tensor, *a, **k):
        work = isend(tensor, *a, op="send", **k)
        work.wait()

    def recv(tensor, *a, **k):
        work = irecv(tensor, *a, op="recv", **k)
        work.wait()
        return _arg(a, k, "src", 0, -1)

    class P2POp(real["P2POp"]):  # a real P2POp holding the real isend / irecv
        def __new__(cls, op, *a, **k):
            return real["P2POp"].__new__(cls, ops.get(op, op), *a, **k)

        def __init__(self, op, *a, **k):
            super().__init__(ops.get(op, op), *a, **k)

    def batch_isend_irecv(p2p_op_list):
        san = sanitize.active()
        if san is None:
            return real["batch_isend_irecv"](p2p_op_list)
        works = [isend(o.tensor, o.peer, group=o.group, tag=o.tag) if o.op is real["isend"] else
                 irecv(o.tensor, o.peer, group=o.group, tag=o.tag) for o in p2p_op_list]
        san.group([w.p for w in works if isinstance(w, Work)])  # one NCCL group: they start together
        return works
    for name in FLUSHING:
        if hasattr(dist, name):
            setattr(dist, name, (lambda fn: lambda *a, **k: (sanitize.flush(), fn(*a, **k))[1])(getattr(dist, name)))
    dist.isend, dist.irecv, dist.send, dist.recv = isend, irecv, send, recv
    dist.P2POp, dist.batch_isend_irecv = P2POp, batch_isend_irecv
