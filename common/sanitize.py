"""--sanitize: the hazards of non-blocking transfers, made to fail every time, named by their line.

    ctx.comm = sanitize.install(ctx)   # bootstrap.start, on --sanitize (or TUTOR_SANITIZE=1)
    with sanitize.using(sanitize.Sanitizer(strict=False)) as san:   # a lesson that plants hazards
        ...; san.reports                                             # collects instead of raising

The calls it wraps are common/plumbing/sanitize_calls.py's (mpi4py's Isend / Issend / Irecv / Send / Ssend / Recv
on ctx.comm; torch's isend, irecv, send, recv and batch_isend_irecv, which p2p.start uses). What a
sanitized call gets (host buffers only):
  NCCL's order (on for --sanitize; Sanitizer(order=True) elsewhere): the rank's calls run on one
    simulated stream, ungrouped ones in their order, a send done only once its receive is posted, a
    group together (sanitize_calls.py says what a group is); each is a flight record (common/flight.py)
    until waited, so a head-to-head exchange deadlocks as on NCCL, and a rank stuck STUCK_S in a wait
    whose stream waits in a cycle with the others' (read from their records) reports it, every rank of
    the cycle, then (collecting) posts what it holds, as MPI and gloo would;
  a send buffer is checksummed when posted and again when waited: a change names both lines;
  its data is taken only when the stream starts it, at this rank's next communication call (a wait, a
    test, any call on the comm or on torch.distributed), so a buffer reused before then arrives new;
  a receive goes into a buffer of the sanitizer's own; the learner's buffer holds poison (NaN,
    or bytes 0xA5 for integers) until the wait copies the data in: read early, it is poison every
    time; written early, the wait sees the poison changed; a line of the learner's code that, before
    the wait, loads a name bound to the posted buffer (or a view inside it), or takes a part of an
    array that overlaps it (`u[:HALO]`, an index of names and arithmetic), is named as a read;
  a buffer that is both a pending send's and a receive's (or two receives') is named when posted;
  a request never waited is named at exit (its send is posted then, so no peer waits forever).
A line is file.py:LINE of the innermost frame outside common/ and outside installed packages.
strict (--sanitize): the first report raises SanitizeError (mpi4py then ends every rank); a
request never waited makes the rank exit 3. Without a run folder (TUTOR_RUN_DIR) there are no records
to read: a wait that moves nothing for LONE_S is reported as a deadlock or a peer that never came.
At exit rank 0 prints the checks' cost (same-run ratio; the tracer's few microseconds per traced line
are not in it). Receives are staged in anonymous memory,
outside tracemalloc's count, so a lesson's measured peaks stay its own. On a GPU run it is off.
"""
import ast
import atexit
import contextlib
import dis
import itertools
import linecache
import os
import sys
import time
import zlib

import numpy as np

from common import flight
from common.plumbing import run_folder

KIT = flight.KIT  # common/ and common/plumbing/: the kit's frames, never a learner's
LIBS = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))
POISON_BYTE = 0xA5
_KEPT = []         # what requests never waited hold, kept for the process's life
_ACTIVE = [None]   # the Sanitizer the wrapped calls report to; None: they pass straight through
_USER = {}         # filename -> True for a learner's file (not common/, not an installed package)
STUCK_S = 0.3      # a wait that moved nothing this long reads the ranks' records for a cycle
LONE_S = 20.0      # without records: a wait that moved nothing this long is reported
_GROUPS, _CYCLES = itertools.count(1), itertools.count(1)


class SanitizeError(RuntimeError):
    pass


def _user(name):
    mine = _USER.get(name)
    if mine is None:
        real = os.path.realpath(name)
        mine = _USER[name] = not (name.startswith("<") or os.path.dirname(real) in KIT
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


def array(buf):
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
    """One sanitized request: a send or a receive (into `stage`), posted when its stream starts it."""

    def __init__(self, kind, buf, arr, where, peer, tag, test):
        self.kind, self.buf, self.arr, self.site, self.peer, self.tag = kind, buf, arr, where, peer, tag
        self.span, self.real, self.stage, self.post, self.done, self.read = _span(arr), None, None, None, False, False
        self.test, self.group, self.started, self.ready, self.slot = test or (lambda real: True), None, False, False, -1

    def peers(self):
        return f"{self.kind[0]}{self.peer}"


class Sanitizer:
    """The checks of one run (or one `using` block): what is pending, what was reported, and its cost."""

    def __init__(self, strict=True, rank=0, quiet=False, order=None):
        self.strict, self.rank, self.quiet, self.order = strict, rank, quiet, strict if order is None else order
        self.pending, self.stream, self.reports, self.maybe = [], [], [], None
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

    def send(self, buf, post, peer=None, tag=0, test=None, op="isend"):
        """A send of `buf` to `peer`: post(buf) makes the real one when the stream starts it, test(real)
        says it is done. Returns its Posted (None: a buffer not checked, the caller posts it itself)."""
        t0, p = time.perf_counter(), self._open("send", buf, peer, tag, test)
        if p is None:
            return None
        p.crc, p.post = _crc(p.arr), post
        return self._posted(p, op, t0)

    def _open(self, kind, buf, peer, tag, test):
        """A Posted for `buf` (None when it is no array the checks can read), after this rank's earlier
        calls are settled and the buffer is checked against every pending one."""
        arr = array(buf)
        if arr is None:
            return None
        p = Posted(kind, buf, arr, site(), peer, tag, test)
        self._settle(p.site)
        self._alias(p)
        return p

    def recv(self, buf, post, stage, peer=None, tag=0, test=None, op="irecv"):
        """A receive into `buf` from `peer`: post(staged) makes the real one into stage(buf), a buffer
        like it, when the stream starts it; test(real) says it is done."""
        t0, p = time.perf_counter(), self._open("recv", buf, peer, tag, test)
        if p is None:
            return None
        arr = p.arr
        p.staged = stage(buf)
        p.stage = array(p.staged)
        p.stage[...] = arr.reshape(p.stage.shape)  # a shorter message leaves the rest as it was
        _poison(arr)
        p.crc, p.post = _crc(arr), post
        self._posted(p, op, t0)
        self._trace(True)
        return p

    def _posted(self, p, op, t0):
        self.pending.append(p)
        self.stream.append(p)
        self.counts[p.kind] += 1
        p.slot = flight.get().begin(op, "p2p", p.arr, peers=p.peers() if p.peer is not None else "")
        self.spent += time.perf_counter() - t0
        return p

    # ---------------------------------------------------------------- the simulated stream
    def group(self, ps):
        """These requests (posted, not started) start together, as one NCCL group."""
        gid = next(_GROUPS)
        for p in ps:
            if not p.started:
                p.group = gid

    def _start(self, p):
        p.started = True
        p.real = p.post(p.staged if p.kind == "recv" else p.buf)

    def _ready(self, p):
        if p.started and not p.ready:
            p.ready = bool(p.test(p.real))
        return p.ready

    def flush(self):
        """Move the stream, never waiting: start its first call (or group), and the next once that is
        done. True when anything moved."""
        moved = False
        if not self.order:  # every call on its own, as MPI and gloo run them: all start now
            for p in self.stream:
                self._start(p)
            moved, self.stream = bool(self.stream), []
        while self.stream:
            head = self.stream[0]
            unit = [head] if head.group is None else [p for p in self.stream if p.group == head.group]
            for p in unit:
                if not p.started:
                    self._start(p)
                    moved = True
            if not all([self._ready(p) for p in unit]):
                return moved
            self.stream = [p for p in self.stream if p not in unit]
            moved = True
        return moved

    def test(self, ps, group=False):
        """A test of requests `ps`: True (each checked and delivered) once every one is done."""
        if group:
            self.group(ps)
        self.flush()
        if all(p.done or self._ready(p) for p in ps):
            for p in ps:
                self.complete(p)
            return True
        return False

    def wait(self, ps, group=False):
        """Wait for requests `ps` (together: one group), moving the stream; then check and deliver."""
        if group:
            self.group(ps)
        waited = site()
        self._until(lambda: all(p.done or self._ready(p) for p in ps), waited)
        for p in ps:
            self.complete(p, waited)

    def drain(self):
        """Wait until the stream holds nothing (a call that runs behind it, as Sendrecv)."""
        self._until(lambda: not self.stream, site())

    def idle(self):
        self.flush() or time.sleep(0.0002)

    def _until(self, done, waited):
        t0 = last = time.perf_counter()
        slot, pause = -1, 0.0
        while True:
            moved = self.flush()
            if done():
                break
            now = time.perf_counter()
            if moved:
                last, pause = now, 0.0
            if slot < 0 and now - t0 > 0.02:  # blocked: what it waits for is recorded, for a reader
                head = self.stream[0] if self.stream else None
                unit = [] if head is None else [head] if head.group is None else \
                    [p for p in self.stream if p.group == head.group]
                queued = any(not p.started for p in self.stream)
                slot = flight.get().begin("wait, queued" if queued else "wait", "p2p", peers=" ".join(
                    p.peers() for p in unit if not p.ready and p.peer is not None))
            if now - last > STUCK_S and self.stream and self._cycle(waited, now - last):
                last = now
            pause = min(0.002, pause + 0.0001)
            time.sleep(pause)
        flight.get().end(slot, host=True)

    def _cycle(self, waited, seconds):
        """Report a deadlock of the simulated streams (this rank's and the others', from their flight
        records in the run folder), once every rank of it saw it; then post what the stream holds
        (collecting) or raise (strict). False when there is none (yet)."""
        run_dir = run_folder.seen()
        if run_dir:
            loop = _records_cycle(run_dir, self.rank)
            if not loop:
                return False
            k = next(_CYCLES)  # the k-th seen
            open(run_folder.cycle_mark(run_dir, k, self.rank), "w").close()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 5 and not all(os.path.exists(run_folder.cycle_mark(run_dir, k, r))
                                                            for r in loop):
                time.sleep(0.01)  # every rank of the cycle reports it, before any moves on
            said = " -> ".join(map(str, loop + loop[:1]))
        elif seconds < LONE_S:
            return False
        else:
            said = f"nothing moved for {seconds:.0f} s (no run folder: a deadlock, or a peer that never came)"
        head = self.stream[0]
        for p in self.stream:  # MPI's and gloo's own rules from here: every call posted now
            if not p.started:
                self._start(p)
        self.stream = []
        self.report("ungrouped point-to-point calls deadlock in NCCL's order",
                    f"{head.kind} posted at {head.site}, waited at {waited} (ranks {said})")
        return True

    def complete(self, p, waited=None):
        """The request `p` is done (its wait or a test said so): check it, deliver a receive."""
        if p.done:
            return
        t0, p.done, waited = time.perf_counter(), True, waited or site()
        flight.get().end(p.slot, host=True)
        if p in self.stream:
            self.stream.remove(p)
        self._settle(waited)
        self.pending.remove(p)
        if not any(q.kind == "recv" for q in self.pending):
            self._trace(False)
        changed = _crc(p.arr) != p.crc
        if p.kind == "recv":
            p.arr[...] = p.stage.reshape(p.arr.shape)
        # done: the learner's buffer is theirs again, freed when they drop it (lesson 10 counts the bytes
        # it holds until Python frees them), though a Work or a request of ours may outlive the wait
        p.buf = p.arr = p.stage = p.staged = None
        if hasattr(p.real, "release"):  # torch: its Work holds the tensors it moved
            p.real.release()
        self.spent += time.perf_counter() - t0
        if changed:
            self.report(f"{p.kind} buffer written before its wait", f"posted at {p.site}, waited at {waited}")

    def close(self):
        """At the end: post what is deferred, name every request never waited. Returns the lines."""
        self._settle()
        try:
            for p in self.stream:  # posted now, whatever the order, so that no peer waits forever
                if not p.started:
                    self._start(p)
            t0 = time.perf_counter()  # a send in NCCL's order waits for its receiver's word: a while
            while time.perf_counter() - t0 < 5 and not all(self._ready(p) for p in self.pending
                                                           if p.kind == "send" and not p.done):
                time.sleep(0.001)
        except Exception:  # the transport is gone already: the request is named all the same
            pass
        self.stream = []
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
            arr = array(obj) if isinstance(obj, np.ndarray) or hasattr(obj, "data_ptr") else None
            if arr is None or (cut is not None and not self._near(_span(arr))):
                continue
            if cut is not None:  # name[...] of an array that holds a posted receive: which part?
                try:
                    arr = arr[eval(cut, frame.f_globals, dict(frame.f_locals))]
                except Exception:
                    continue
                if not isinstance(arr, np.ndarray) or arr.size == 0 or not np.shares_memory(arr, array(obj)):
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
    if san is not None and san.stream:
        san.flush()


def active():
    """The Sanitizer the wrapped calls report to now, or None."""
    return _ACTIVE[0]


def _records_cycle(run_dir, rank):
    """[rank, ...]: a cycle of ranks blocked in a sanitized wait with calls queued behind it, each
    waiting on the next (a send on a peer not already receiving from it), read from the records."""
    waits = {}
    for record in run_folder.rank_files(run_dir, "flight").values():
        try:
            with open(record, "rb") as f:
                head, entries = flight.parse(f.read())
        except OSError:
            continue
        last = entries[-1] if entries else None
        if head and last and last["op"] == "wait, queued" and last["state"] == "started":
            waits[head["rank"]] = last["peers"].split()
    nxt = {r: [int(p[1:]) for p in ps if int(p[1:]) in waits and (p[0] == "r" or f"r{r}" not in waits[int(p[1:])])]
           for r, ps in waits.items()}
    path = [rank]
    while path[-1] in nxt and nxt[path[-1]]:
        step = nxt[path[-1]][0]
        if step in path:
            loop = path[path.index(step):]
            return loop if rank in loop else None
        path.append(step)
    return None


def comm(c):
    from common.plumbing import sanitize_calls
    return sanitize_calls.comm(c)


def patch_torch(world=None):
    """torch.distributed's point-to-point calls sanitized (common/plumbing/sanitize_calls.py). Collective over
    `world` (default: the MPI world), whose duplicate carries NCCL's order's tokens."""
    from common.plumbing import sanitize_calls
    if world is None:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
    sanitize_calls.patch_torch(world)


def install(ctx, order=True):
    """Sanitize this run (strict) and return ctx.comm wrapped; on a GPU run, say why not (rank 0).
    order: NCCL's order too (--sanitize); off, the buffer hazards only (a practice run's default)."""
    if ctx.device != "cpu":
        if ctx.rank == 0:
            print("note: --sanitize checks host buffers, and this run moves its data on the GPU: it is off",
                  flush=True)
        return ctx.comm
    _ACTIVE[0] = Sanitizer(strict=True, rank=ctx.rank, order=order)
    if ctx.api == "torch":
        patch_torch(ctx.comm)
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
