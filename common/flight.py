"""The flight recorder: every rank keeps its last calls in a small file, so a hang can be explained.

    rec = flight.get()                          # this process's recorder (bootstrap.start made it)
    with rec.call("all_reduce", buf, comm="world"):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    be = recorded.wrap(backend)                 # common/plumbing/recorded.py: p2p.backend() and
                                                # collectives.library() do this

Each call is one fixed-size slot of a ring (SLOTS of them) in $TUTOR_RUN_DIR/rankR.flight, written in
place through mmap before the call starts and again when it ends: a rank blocked inside a C MPI call
cannot run Python, so what it was doing must be on disk already. A slot holds the call's sequence
number on its communicator (collectives and point-to-point counted apart), op, dtype, count, root,
peers, the communicator's name and a state, as the host sees it: started (inside the call), enqueued
(a GPU call returned once queued; marked completed at the next sync) or completed. torch's flight
recorder says what the GPU sees instead: scheduled, started (only with TORCH_NCCL_ENABLE_TIMING=1),
completed. The header counts every write, so a reader sees whether a rank's record still moves.
Without a run folder the same ring lives in memory (the lesson can still read itself: entries()).
common/runner/flightwatch.py reads the files, common/runner/diagnose.py names the first divergence;
common/plumbing/collcheck.py is --debug-collectives.
"""
import errno
import json
import mmap
import os
import struct
import sys
import time

from common.plumbing import run_folder

SLOTS = 64
HEAD = struct.Struct("<4sIqqdd")        # magic, rank, pid, writes, time of the last write, spare
SLOT = struct.Struct("<qqiiBB6xdd16s8s24s24s24s")  # seq, count, root, tag, kind, state, t0, t1, op,
KINDS, STATES = ("", "coll", "p2p", "loop"), ("", "started", "enqueued", "completed")  # dtype, comm, peers, site
HOME = os.path.dirname(os.path.abspath(__file__))
KIT = (HOME, os.path.join(HOME, "plumbing"))  # a call's site is the first frame outside these two folders
MAGIC = b"FLT1"
_WRITES, _STATE, _TIME = struct.Struct("<qd"), struct.Struct("<B"), struct.Struct("<d")  # in-place parts
SIZE = HEAD.size + SLOTS * SLOT.size
_ME = []


class Recorder:
    def __init__(self, rank, path=None, gpu=False, check=None):
        self.rank, self.gpu, self.check, self.writes, self.seqs, self.pending = rank, gpu, check, 0, {}, set()
        self.pid, self.off = os.getpid(), False
        if path:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _reserve(fd, path)
                self.buf = mmap.mmap(fd, SIZE)
            finally:
                os.close(fd)
        else:
            self.buf = bytearray(SIZE)
        self.index = 0
        HEAD.pack_into(self.buf, 0, MAGIC, self.rank, self.pid, 0, time.time(), 0.0)

    def _head(self, now):
        self.writes += 1
        _WRITES.pack_into(self.buf, 16, self.writes, now)

    def begin(self, op, kind, buf=None, comm="world", root=-1, peers="", members=None, tag=-1):
        """Write a started slot; return its slot number (end() marks it done)."""
        if self.off:  # inside a timed loop: its one slot stands for every call
            return -1
        key = (comm, kind)
        seq = self.seqs[key] = self.seqs.get(key, 0) + 1
        count, dtype = (_size(buf), _dtype(buf)) if buf is not None else (0, "")
        slot = self.index % SLOTS
        self.index += 1
        now = time.time()
        SLOT.pack_into(self.buf, HEAD.size + slot * SLOT.size, seq, count, root, tag, KINDS.index(kind),
                       1, now, 0.0, _b(op), _b(dtype), _b(comm), _b(peers), _site())
        self.writes += 1
        _WRITES.pack_into(self.buf, 16, self.writes, now)
        if self.check is not None and kind == "coll":  # --debug-collectives: agree before the call
            self.check(self, seq, op, dtype, count, root, comm, members)
        return slot

    def end(self, slot, host=False):
        """Mark the slot completed, or enqueued on a GPU (completed at the next sync()); host: a call
        on host buffers (the sanitizer's), done when it returns even on a GPU run."""
        if slot < 0:
            return
        at, now = HEAD.size + slot * SLOT.size, time.time()
        gpu = self.gpu and not host
        _TIME.pack_into(self.buf, at + 40, now)
        _STATE.pack_into(self.buf, at + 25, 2 if gpu else 3)
        if gpu:  # a set of slots: at most SLOTS, however long a lesson goes without a sync
            self.pending.add(slot)
        self.writes += 1
        _WRITES.pack_into(self.buf, 16, self.writes, now)

    def synced(self):
        """Every enqueued GPU call has finished (the caller synchronized the device)."""
        for slot in self.pending:
            _STATE.pack_into(self.buf, HEAD.size + slot * SLOT.size + 25, 3)
        if self.pending:
            self.pending = set()
            self._head(time.time())

    def call(self, op, buf=None, comm="world", root=-1, peers="", kind="coll", members=None):
        """`with rec.call(...):` around one call: started before it, done after it returns."""
        return _Call(self, op, kind, buf, comm, root, peers, members)

    def timed(self, iters):
        """`with rec.timed(iters):` around a timing loop (common/bandwidth.time_op): one `loop` slot
        for all its calls, which are not recorded one by one, so the clock measures the library and
        not the recorder (~2.5 us a call). A hang inside shows as a wait in that loop."""
        return _Loop(self, iters)

    def entries(self):
        return parse(bytes(self.buf))[1]


class NoRoom(OSError):
    """The run folder's disk cannot hold a recorder: one line, where a write into the mapped file
    would have killed the rank with SIGBUS."""


def _reserve(fd, path):
    """Give the file its SIZE bytes on disk now: a page of a mapped file that the disk has no room for
    is a SIGBUS at the first write, not an error. NoRoom names the space needed."""
    try:
        os.ftruncate(fd, SIZE)
        try:
            os.posix_fallocate(fd, 0, SIZE)
        except (AttributeError, OSError) as exc:  # no fallocate here (macOS, some file systems): write
            if isinstance(exc, OSError) and exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            os.pwrite(fd, bytes(SIZE), 0)
    except OSError as exc:
        os.unlink(path)
        raise NoRoom(f"no room for this rank's flight recorder ({-(-SIZE // 1024)} KiB) in "
                     f"{os.path.dirname(path)}: {exc.strerror}; free some space, or set TMPDIR elsewhere") from None


class _Call:
    __slots__ = ("rec", "args", "slot", "was")

    def __init__(self, rec, *args):
        self.rec, self.args = rec, args

    def __enter__(self):
        self.slot = self.rec.begin(*self.args)
        # the call's own slot stands for what it does inside (--sanitize's sends, receives and waits)
        self.was, self.rec.off = self.rec.off, self.rec.off or self.slot >= 0

    def __exit__(self, kind, value, tb):
        self.rec.off = self.was
        if kind is None:  # a call that raised stays `started`: it never completed
            self.rec.end(self.slot)


class _Loop:
    __slots__ = ("rec", "iters", "slot")

    def __init__(self, rec, iters):
        self.rec, self.iters = rec, iters

    def __enter__(self):
        self.slot = self.rec.begin("timed loop", "loop", None, "world", peers=f"{self.iters} calls")
        self.rec.off = self.slot >= 0  # a loop inside a loop leaves the outer one in charge

    def __exit__(self, kind, value, tb):
        if self.slot >= 0:
            self.rec.off = False
            if kind is None:
                self.rec.end(self.slot)


_BYTES, _FILES = {}, {}


def _b(text):
    b = _BYTES.get(text)
    if b is None:
        b = _BYTES[text] = text.encode()
    return b


def _site():
    """b'file.py:LINE' of the innermost frame outside common/ (the lesson's line that made the call)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        short = _FILES.get(name)
        if short is None:
            short = _FILES[name] = "" if os.path.dirname(name) in KIT else os.path.basename(name)
        if short:
            return f"{short}:{f.f_lineno}".encode()
        f = f.f_back
    return b""


def _size(buf):
    return buf.numel() if hasattr(buf, "numel") else int(getattr(buf, "size", 0))


def _dtype(buf, names={}):
    d = getattr(buf, "dtype", "")
    name = names.get(d)
    if name is None:  # str() of a NumPy dtype takes ~2 us: once per dtype
        name = names[d] = str(d).replace("torch.", "")
    return name


def install(rank, gpu=False, check=None):
    """This process's recorder, on file when the runner gave a run folder."""
    run_dir = run_folder.seen()
    path = run_folder.rank_file(run_dir, rank, "flight") if run_dir else None
    _ME[:] = [Recorder(rank, path, gpu, check)]
    return _ME[0]


def plant(np, stuck_s, params):
    """Rank 0 of a lesson that breaks on purpose tells the runner (common/runner/flightwatch.py): end
    the run once every rank has waited stuck_s seconds in a call, then grade the diagnosis on params."""
    run_dir = run_folder.seen()
    if run_dir:
        from common.report import atomic_write
        atomic_write(run_folder.planted(run_dir),
                     json.dumps({"np": np, "stuck_s": stuck_s, "params": params}))


def get():
    return _ME[0] if _ME else install(0)


def parse(data):
    """(header dict, [entry dict] oldest first) of a recorder's bytes; (None, []) if not one."""
    if len(data) < SIZE or data[:4] != MAGIC:
        return None, []
    _, rank, pid, writes, at, _ = HEAD.unpack_from(data, 0)
    out = []
    for i in range(SLOTS):
        seq, count, root, tag, kind, state, t0, t1, op, dtype, comm, peers, site = SLOT.unpack_from(
            data, HEAD.size + i * SLOT.size)
        if seq:
            out.append({"seq": seq, "kind": KINDS[kind], "op": _text(op), "dtype": _text(dtype),
                        "count": count, "root": root, "comm": _text(comm), "peers": _text(peers),
                        "state": STATES[state], "t0": t0, "t1": t1, "site": _text(site)})
    out.sort(key=lambda e: e["t0"])
    return {"rank": rank, "pid": pid, "writes": writes, "time": at}, out


def _text(b):
    return b.rstrip(b"\0").decode(errors="replace")
