"""--sanitize: the hazards of non-blocking transfers, made to fail every time, named by their line.

    ctx.comm = sanitize.install(ctx)   # bootstrap.start, on --sanitize (or TUTOR_SANITIZE=1)
    with sanitize.using(sanitize.Sanitizer(strict=False)) as san:   # a lesson that plants hazards
        ...; san.reports                                             # collects instead of raising

What a posted request gets (mpi4py's Isend / Issend / Irecv on ctx.comm; torch's isend, irecv and
batch_isend_irecv, which p2p.start uses; host buffers only):
  a send buffer is checksummed when posted and again when waited: a change names both lines;
  its data is taken only at this rank's next communication call (a wait, a test, any call on the
    comm or on torch.distributed), so a buffer reused before its wait arrives as the new data;
  a receive goes into a buffer of the sanitizer's own; the learner's buffer holds poison (NaN,
    or bytes 0xA5 for integers) until the wait copies the data in: read early, it is poison every
    time; written early, the wait sees the poison changed; a line of the learner's code that, before
    the wait, loads a name bound to the posted buffer (or a view inside it), or takes a part of an
    array that overlaps it (`u[:HALO]`, an index of names and arithmetic), is named as a read;
  a buffer that is both a pending send's and a receive's (or two receives') is named when posted;
  a request never waited is named at exit (its send is posted then, so no peer waits forever).
A line is file.py:LINE of the innermost frame outside common/ and outside installed packages.
strict (--sanitize): the first report raises SanitizeError (mpi4py then ends every rank); a
request never waited makes the rank exit 3. At exit rank 0 prints the checks' cost (same-run ratio;
the tracer's few microseconds per traced line are not in it). Receives are staged in anonymous memory,
outside tracemalloc's count, so a lesson's measured peaks stay its own. On a GPU run it is off.
"""
import atexit
import contextlib
import ast
import dis
import linecache
import mmap
import os
import sys
import time
import zlib

import numpy as np

HOME = os.path.dirname(os.path.abspath(__file__))
LIBS = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))
POISON_BYTE = 0xA5
_KEPT = []         # what requests never waited hold, kept for the process's life
_ACTIVE = [None]   # the Sanitizer the wrapped calls report to; None: they pass straight through
_USER = {}         # filename -> True for a learner's file (not common/, not an installed package)


class SanitizeError(RuntimeError):
    pass


def _user(name):
    mine = _USER.get(name)
    if mine is None:
        real = os.path.realpath(name)
        mine = _USER[name] = not (name.startswith("<") or os.path.dirname(real) == HOME
                                  or real.startswith(LIBS) or "site-packages" in real)
    return mine


def site(frame=None):
    """'file.py:LINE' of the innermost learner's frame (see _user), or '?'."""
    f = frame or sys._getframe(1)
    while f is not None:
        if _user(f.f_code.co_filename):
            return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _array(buf):
    """A NumPy view of a host buffer (an ndarray, a CPU tensor, bytes-like, or mpi4py's [buf, type]),
    or None for what the sanitizer does not understand (left unchecked)."""
    if isinstance(buf, (list, tuple)) and buf:
        buf = buf[0]
    if isinstance(buf, np.ndarray):
        return buf if buf.size else None
    if hasattr(buf, "numpy") and getattr(getattr(buf, "device", None), "type", "") == "cpu":
        if not buf.numel():
            return None
        try:
            return buf.detach().numpy()
        except TypeError:  # a dtype NumPy lacks (bfloat16): its bytes, poisoned 0xA5
            return buf.detach().view(-1).view(_torch_uint8()).numpy() if buf.is_contiguous() else None
    try:
        a = np.frombuffer(buf, np.uint8)
    except (TypeError, ValueError):
        return None
    return a if a.size else None


def _torch_uint8():
    import torch
    return torch.uint8


_BOUNDS = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or getattr(np, "byte_bounds", None)


def _span(a):
    """(first byte, one past the last) of array a's memory."""
    return _BOUNDS(a)


def _crc(a):
    return zlib.crc32(a.data if a.flags.c_contiguous else a.tobytes())


def _poison(a):
    if a.dtype.kind in "fc":
        a[...] = np.nan
    else:
        a[...] = np.frombuffer(bytes([POISON_BYTE]) * a.dtype.itemsize, a.dtype)[0]


class Posted:
    """One sanitized request: a send (deferred until flushed) or a receive (into `stage`)."""

    def __init__(self, kind, buf, arr, where):
        self.kind, self.buf, self.arr, self.site = kind, buf, arr, where
        self.span, self.real, self.stage, self.post, self.done, self.read = _span(arr), None, None, None, False, False


class Sanitizer:
    """The checks of one run (or one `using` block): what is pending, what was reported, and its cost."""

    def __init__(self, strict=True, rank=0, quiet=False):
        self.strict, self.rank, self.quiet = strict, rank, quiet
        self.pending, self.deferred, self.reports, self.maybe = [], [], [], None
        self.counts, self.spent, self.t0 = {"send": 0, "recv": 0}, 0.0, time.perf_counter()
        self.traced = sys.gettrace() is None  # a debugger's or coverage's tracer is left alone
        self.stopped = False

    def report(self, what, where, raise_=True):
        """One hazard: what it is, and where (its lines). Kept as 'what: where'; strict: raised."""
        self.reports.append(f"{what}: {where}")
        if not self.quiet:
            print(f"sanitize: rank {self.rank}: {what}\n  {where}", file=sys.stderr, flush=True)
        if self.strict and raise_:
            self.stopped = True  # the run ends here: what it left pending is no further news
            raise SanitizeError(f"{what}: {where}")

    def _alias(self, new):
        for p in self.pending:
            if "recv" in (p.kind, new.kind) and p.span[0] < new.span[1] and new.span[0] < p.span[1]:
                both = "a send's and a receive's" if p.kind != new.kind else "two receives'"
                self.report(f"one buffer is {both}", f"{p.kind} posted at {p.site}, {new.kind} posted at "
                            f"{new.site}, neither waited")

    def send(self, buf, post):
        """A send of `buf`; post(buf) makes the real one (at the next flush). Returns its Posted."""
        t0, arr = time.perf_counter(), _array(buf)
        if arr is None:
            return None
        p = Posted("send", buf, arr, site())
        self._settle(p.site)
        self._alias(p)
        p.crc, p.post = _crc(arr), post
        self.pending.append(p)
        self.deferred.append(p)
        self.counts["send"] += 1
        self.spent += time.perf_counter() - t0
        return p

    def recv(self, buf, post, stage):
        """A receive into `buf`: post(staged) makes the real one into stage(buf), a buffer like it."""
        t0, arr = time.perf_counter(), _array(buf)
        if arr is None:
            return None
        p = Posted("recv", buf, arr, site())
        self._settle(p.site)
        self._alias(p)
        staged = stage(buf)
        p.stage = _array(staged)
        p.stage[...] = arr.reshape(p.stage.shape)  # a shorter message leaves the rest as it was
        _poison(arr)
        p.crc = _crc(arr)
        self.pending.append(p)
        self.counts["recv"] += 1
        self.spent += time.perf_counter() - t0
        p.real = post(staged)
        self._trace(True)
        return p

    def flush(self):
        """Post every deferred send now, its data as its buffer holds it now."""
        while self.deferred:
            p = self.deferred.pop(0)
            p.real = p.post(p.buf)

    def complete(self, p):
        """The request `p` is done (its wait or a test said so): check it, deliver a receive."""
        if p.done:
            return
        t0, p.done, waited = time.perf_counter(), True, site()
        self._settle(waited)
        self.pending.remove(p)
        if not any(q.kind == "recv" for q in self.pending):
            self._trace(False)
        changed = _crc(p.arr) != p.crc
        if p.kind == "recv":
            p.arr[...] = p.stage.reshape(p.arr.shape)
        self.spent += time.perf_counter() - t0
        if changed:
            self.report(f"{p.kind} buffer written before its wait", f"posted at {p.site}, waited at {waited}")

    def close(self):
        """At the end: post what is deferred, name every request never waited. Returns the lines."""
        self._settle()
        try:
            self.flush()
        except Exception:  # the transport is gone already: the request is named all the same
            pass
        for p in list(self.pending) if not self.stopped else []:
            self.pending.remove(p)
            _KEPT.append(p)  # MPI may still read or write its buffer: it stays alive, as the process
            self.report(f"{p.kind} request never waited", f"posted at {p.site}", raise_=False)
        self._trace(False)
        return self.reports

    def cost(self):
        """(seconds spent in the checks, seconds since this sanitizer began)."""
        return self.spent, time.perf_counter() - self.t0

    # reads before the wait: a line tracer, on only while a receive is pending (Python 3.11: settrace)
    def _trace(self, on):
        if not self.traced:
            return
        if on and sys.gettrace() is not _global:
            sys.settrace(_global)
            f = sys._getframe(1)
            while f is not None:  # the frames already running (settrace reaches new ones only)
                if _user(f.f_code.co_filename):
                    f.f_trace, f.f_trace_lines = _local, True
                f = f.f_back
        elif not on and sys.gettrace() is _global:
            sys.settrace(None)

    def _settle(self, where=None):
        """Report the read seen last, unless its line was the one posting or waiting at `where` (that
        line loaded the buffer's name to hand it over)."""
        maybe, self.maybe = self.maybe, None
        if maybe is not None and maybe[1] != where:
            self.report("receive buffer read before its wait", f"posted at {maybe[0].site}, read at "
                        f"{maybe[1]} ({maybe[2]})")

    def line(self, frame):
        t0 = time.perf_counter()
        self._settle()
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        names = _loads(frame.f_code).get(frame.f_lineno, ())
        cuts = _cuts(frame.f_code.co_filename).get(frame.f_lineno, [])
        for name, cut in [(n, None) for n in names] + cuts:
            obj = frame.f_locals.get(name, frame.f_globals.get(name))
            arr = _array(obj) if isinstance(obj, np.ndarray) or hasattr(obj, "data_ptr") else None
            if arr is None or (cut is not None and not self._near(_span(arr))):
                continue
            if cut is not None:  # name[...] of an array that holds a posted receive: which part?
                try:
                    arr = arr[eval(cut, frame.f_globals, dict(frame.f_locals))]
                except Exception:
                    continue
                if not isinstance(arr, np.ndarray) or arr.size == 0 or not np.shares_memory(arr, _array(obj)):
                    continue
            lo, hi = _span(arr)
            for p in self.pending:
                inside = p.span[0] <= lo and hi <= p.span[1] if cut is None else p.span[0] < hi and lo < p.span[1]
                if p.kind == "recv" and not p.read and inside and p.site != where:  # not its own post's line
                    p.read = True
                    self.maybe = (p, where, name if cut is None else f"{name}[...]")
        self.spent += time.perf_counter() - t0

    def _near(self, span):
        return any(p.kind == "recv" and p.span[0] < span[1] and span[0] < p.span[1] for p in self.pending)


_LOADS = {}
_NAME_LOADS = {"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF"}


def _loads(code):
    """{line: names the line loads} of a code object, once per code object."""
    got = _LOADS.get(code)
    if got is None:
        got = _LOADS[code] = {}
        for ins in dis.get_instructions(code):
            if ins.opname in _NAME_LOADS and ins.positions and ins.positions.lineno:
                got.setdefault(ins.positions.lineno, set()).add(ins.argval)
    return got


_CUTS = {}
_SAFE = (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Slice, ast.Tuple, ast.Load, ast.operator,
         ast.unaryop)


def _cuts(filename):
    """{line: [(name, code of its index)]} for each `name[index]` in a file whose index has no call
    (names, numbers, arithmetic, slices): safe to evaluate again to see which part is read."""
    got = _CUTS.get(filename)
    if got is None:
        got = _CUTS[filename] = {}
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            return got
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and isinstance(node.ctx, ast.Load) and all(isinstance(n, _SAFE) for n in ast.walk(node.slice))):
                code = compile(ast.Expression(node.slice), filename, "eval")
                got.setdefault(node.lineno, []).append((node.value.id, code))
    return got


def _global(frame, event, arg):
    return _local if _user(frame.f_code.co_filename) else None


def _local(frame, event, arg):
    san = _ACTIVE[0]
    if event == "line" and san is not None and san.pending:
        san.line(frame)
    return _local


@contextlib.contextmanager
def using(san):
    """Report to `san` inside the block (None: the calls pass straight through); its end closes it."""
    before, _ACTIVE[0] = _ACTIVE[0], san
    try:
        yield san
    finally:
        if san is not None:
            san.close()
        _ACTIVE[0] = before


def flush():
    san = _ACTIVE[0]
    if san is not None and san.deferred:
        san.flush()


def install(ctx):
    """Sanitize this run (strict) and return ctx.comm wrapped; on a GPU run, say why not (rank 0)."""
    if ctx.device != "cpu":
        if ctx.rank == 0:
            print("note: --sanitize checks host buffers, and this run moves its data on the GPU: it is off",
                  flush=True)
        return ctx.comm
    _ACTIVE[0] = Sanitizer(strict=True, rank=ctx.rank)
    if ctx.api == "torch":
        patch_torch()
    atexit.register(_at_exit, ctx.rank)
    return comm(ctx.comm)


def _at_exit(rank):
    san = _ACTIVE[0]
    if san is None:
        return
    lines = san.close()
    spent, total = san.cost()
    if rank == 0 and not sum(san.counts.values()):
        print("sanitize: rank 0 posted no non-blocking transfer: nothing to check", flush=True)
    elif rank == 0:
        print(f"sanitize: rank 0 checked {san.counts['send']} sends, {san.counts['recv']} receives: "
              f"{len(lines) or 'no'} reports; checks {spent * 1e3:.1f} ms = {spent / max(total, 1e-9):.1%} "
              f"of its {total:.2f} s\nsanitize: sends left late and receives were copied: this run's "
              "timings measure that too", flush=True)
    if lines:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)


# ---------------------------------------------------------------- the wrapped calls: mpi4py
_ORIG = {}  # what was replaced: "Comm" (the sanitized class), "Request", "torch" ({name: function})


def comm(c):
    """c (an mpi4py Intracomm) as one whose Isend, Issend and Irecv are sanitized and whose every other
    call posts the deferred sends first; MPI.Request's Waitall and friends learn its requests."""
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
            flush()
            return getattr(super(cls, self), name)(*args, **kwargs)
        return call
    for name in dir(base):
        if not name.startswith("_") and callable(getattr(base, name)) and not isinstance(
                getattr(base, name), type):
            ns[name] = flushing(name)
    for name in ("Isend", "Issend"):
        ns[name] = (lambda fn: lambda self, buf, *a, **k: _posted_send(fn, self, buf, a, k))(getattr(base, name))
    ns["Irecv"] = lambda self, buf, *a, **k: _posted_recv(base.Irecv, self, buf, a, k)
    cls = type("SanitizedComm", (base,), ns)
    return cls


def _posted_send(fn, c, buf, a, k):
    san = _ACTIVE[0]
    p = san.send(buf, lambda b: fn(c, b, *a, **k)) if san else None
    return _request(san, p) if p else fn(c, buf, *a, **k)


def _posted_recv(fn, c, buf, a, k):
    san = _ACTIVE[0]
    p = san.recv(buf, lambda b: fn(c, b, *a, **k), _like) if san else None
    return _request(san, p) if p else fn(c, buf, *a, **k)


def _request(san, p):
    r = _req_class()()  # an MPI.Request (null to MPI itself): every wait and test goes through it
    r.san, r.p = san, p
    return r


def _like(buf):
    """A fresh C-ordered buffer like `buf` (mpi4py's [buf, type ...] form kept, its array replaced)."""
    if isinstance(buf, (list, tuple)):
        return type(buf)([_like(buf[0]), *buf[1:]])
    if hasattr(buf, "data_ptr"):
        import torch
        return torch.empty_like(buf, memory_format=torch.contiguous_format)
    a = _array(buf)  # anonymous memory: outside tracemalloc's count, so a lesson's peaks stay its own
    return np.frombuffer(mmap.mmap(-1, a.nbytes), a.dtype).reshape(a.shape)


def _req_class():
    if "Req" not in _ORIG:
        class Req(_ORIG["Request"]):
            """A sanitized request: its wait (or a test that says done) checks and delivers."""

            def __bool__(self):
                return not self.p.done

            def Wait(self, status=None):
                self.san.flush()
                if not self.p.done:
                    self.p.real.Wait(status)
                    self.san.complete(self.p)
                return True

            def Test(self, status=None):
                self.san.flush()
                done = self.p.done or self.p.real.Test(status)
                if done:
                    self.san.complete(self.p)
                return done
        _ORIG["Req"] = Req
    return _ORIG["Req"]


def _requests_class(orig):
    """MPI.Request, whose Waitall / Testall / Waitany / Testany take sanitized requests too."""
    def unwrapped(requests):
        mine = [r for r in requests if isinstance(r, _ORIG.get("Req", ()))]
        for r in mine:
            r.san.flush()
        return mine, [r.p.real if r in mine else r for r in requests]

    class Request(orig):
        @classmethod
        def Waitall(cls, requests, statuses=None):
            mine, real = unwrapped(requests)
            out = orig.Waitall([r for r in real if r is not None], statuses)
            for r in mine:
                r.san.complete(r.p)
            return out

        @classmethod
        def Testall(cls, requests, statuses=None):
            mine, real = unwrapped(requests)
            done = orig.Testall([r for r in real if r is not None], statuses)
            for r in mine if done else []:
                r.san.complete(r.p)
            return done

        @classmethod
        def Waitany(cls, requests, status=None):
            mine, real = unwrapped(requests)
            i = orig.Waitany(real, status)
            if i >= 0 and requests[i] in mine:
                requests[i].san.complete(requests[i].p)
            return i

        @classmethod
        def Testany(cls, requests, status=None):
            mine, real = unwrapped(requests)
            i, done = orig.Testany(real, status)
            if done and i >= 0 and requests[i] in mine:
                requests[i].san.complete(requests[i].p)
            return i, done
    return Request


# ---------------------------------------------------------------- the wrapped calls: torch.distributed
FLUSHING = ("send", "recv", "barrier", "monitored_barrier", "all_reduce", "broadcast", "reduce", "gather",
            "scatter", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
            "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
            "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
            "new_group", "destroy_process_group")


class Work:
    """A sanitized torch Work: wait() (or is_completed() once true) checks and delivers."""

    def __init__(self, san, p):
        self.san, self.p = san, p

    def wait(self, *args, **kwargs):
        self.san.flush()
        if not self.p.done:
            if self.p.real is not None:
                self.p.real.wait(*args, **kwargs)
            self.san.complete(self.p)
        return True

    def is_completed(self):
        self.san.flush()
        done = self.p.done or self.p.real is None or self.p.real.is_completed()
        if done:
            self.san.complete(self.p)
        return done

    def __getattr__(self, name):
        self.san.flush()
        return getattr(self.p.real, name)


def patch_torch():
    """torch.distributed's isend, irecv, P2POp and batch_isend_irecv sanitized (when a Sanitizer is
    active), and its blocking calls made to post the deferred sends first."""
    import torch.distributed as dist
    if "torch" in _ORIG:
        return
    real = _ORIG["torch"] = {n: getattr(dist, n) for n in ("isend", "irecv", "batch_isend_irecv", "P2POp")}

    def isend(tensor, *a, **k):
        san = _ACTIVE[0]
        p = san.send(tensor, lambda t: real["isend"](t, *a, **k)) if san else None
        return Work(san, p) if p else real["isend"](tensor, *a, **k)

    def irecv(tensor, *a, **k):
        san = _ACTIVE[0]
        p = san.recv(tensor, lambda t: real["irecv"](t, *a, **k), _like) if san else None
        return Work(san, p) if p else real["irecv"](tensor, *a, **k)
    ops = {isend: real["isend"], irecv: real["irecv"]}

    class P2POp(real["P2POp"]):  # a real P2POp holding the real isend / irecv
        def __new__(cls, op, *a, **k):
            return real["P2POp"].__new__(cls, ops.get(op, op), *a, **k)

        def __init__(self, op, *a, **k):
            super().__init__(ops.get(op, op), *a, **k)

    def batch_isend_irecv(p2p_op_list):
        if _ACTIVE[0] is None:
            return real["batch_isend_irecv"](p2p_op_list)
        return [isend(o.tensor, o.peer, group=o.group, tag=o.tag) if o.op is real["isend"] else
                irecv(o.tensor, o.peer, group=o.group, tag=o.tag) for o in p2p_op_list]
    for name in FLUSHING:
        if hasattr(dist, name):
            setattr(dist, name, (lambda fn: lambda *a, **k: (flush(), fn(*a, **k))[1])(getattr(dist, name)))
    dist.isend, dist.irecv, dist.P2POp, dist.batch_isend_irecv = isend, irecv, P2POp, batch_isend_irecv
