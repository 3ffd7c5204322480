"""cupy.cuda.nccl of the GPU double: NCCL's calls, checked against the real CuPy, run over MPI.

At import it loads the real compiled cupy_backends.cuda.libs.nccl against a stub libnccl.so.2
(TUTOR_GPU_DOUBLE_LIBNCCL) and takes from it every NCCL_* constant, NcclError, and each call's
parameter list (the first line of its docstring): a call with a missing, extra or unknown argument,
or a non-integer where CuPy declares an integer, raises TypeError as the real one does.

A communicator's members meet through files (so one node only): each writes its MPI world rank
under its NCCL rank in a folder named from the unique id, waits for all `ndev`, then they make one
MPI communicator of their own, in NCCL rank order, so lesson MPI traffic never mixes with NCCL's.
Pointers are the host addresses of the double's arrays; (ptr, count, datatype) reaching outside
every live array faults. Each call is queued on its stream and runs when that stream is needed
(see cupy.cuda.stream): ungrouped, send is a synchronous MPI send (done only once the peer's recv
runs) and recv a blocking one, so head-to-head sends deadlock as on NCCL; between groupStart() and
groupEnd() the calls become one piece of work per stream, its sends and receives all posted at once.
"""
import ctypes
import functools
import hashlib
import inspect
import operator
import os
import re
import shutil
import tempfile
import time

import numpy as np

from cupy.cuda import memory, runtime, stream as _stream


def _load_real():
    lib = os.environ.get("TUTOR_GPU_DOUBLE_LIBNCCL")
    if not lib:
        raise ImportError("GPU double: TUTOR_GPU_DOUBLE_LIBNCCL is not set (run under tests/gpu_double env())")
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # stands in for libnccl.so.2, which the real module links
        from cupy_backends.cuda.libs import nccl as real
    except (OSError, ImportError) as exc:
        raise ImportError(f"GPU double: cannot load the real cupy_backends.cuda.libs.nccl with {lib}: "
                          f"{exc}") from None
    return real


_real = _load_real()
globals().update({k: getattr(_real, k) for k in dir(_real) if k.startswith("NCCL_")})
NcclError, NcclConfig = _real.NcclError, _real.NcclConfig
available = True
SYSTEM_ERROR, INVALID_ARGUMENT, INVALID_USAGE = 2, 4, 5  # ncclResult_t
TIMEOUT_S = float(os.environ.get("TUTOR_GPU_DOUBLE_TIMEOUT", "60"))
_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32,  # noqa: F821 (from _real)
           NCCL_UINT32: np.uint32, NCCL_INT64: np.int64, NCCL_UINT64: np.uint64,  # noqa: F821
           NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}  # noqa: F821
_OPS = {NCCL_SUM: "SUM", NCCL_PROD: "PROD", NCCL_MAX: "MAX", NCCL_MIN: "MIN", NCCL_AVG: "AVG"}  # noqa: F821


def _error(status, detail):
    err = NcclError(status)
    err.args = (f"{err.args[0]}: {detail} (GPU double)",)
    return err


# ---- signatures, read from the real module ---------------------------------------------------------

def signature(real):
    """(name, [(C type, name, default)]) from the first docstring line of a real CuPy NCCL callable."""
    line = (real.__doc__ or "").strip().splitlines()[0]
    match = re.match(r"^(?:\w+\.)?(\w+)\((.*)\)$", line.strip())
    if not match:
        raise ImportError(f"GPU double: no signature in the real CuPy's docstring line {line!r}")
    params = []
    for item in filter(None, (p.strip() for p in match.group(2).split(","))):
        decl, eq, default = item.partition("=")
        ctype, _, name = decl.strip().rpartition(" ")
        if name != "self":
            params.append((ctype or "object", name, default.strip() if eq else inspect.Parameter.empty))
    return match.group(1), params


def _convert(fname, ctype, name, value):
    """The argument as Cython would take it for a parameter of C type `ctype` (stricter on floats)."""
    if ctype in ("int", "size_t", "intptr_t"):
        ok = isinstance(value, int) if ctype == "intptr_t" else hasattr(value, "__index__")
        if not ok or isinstance(value, float):
            raise TypeError(f"an integer is required (GPU double: {fname}() got {type(value).__name__} "
                            f"for {ctype} {name})")
        value = operator.index(value)
        low, high = {"int": (-2**31, 2**31), "size_t": (0, 2**64), "intptr_t": (-2**63, 2**63)}[ctype]
        if value < 0 and ctype == "size_t":
            raise OverflowError("can't convert negative value to size_t")
        if not low <= value < high:
            raise OverflowError(f"Python int too large to convert to C {ctype}")
    elif ctype in ("bytes", "tuple", "list") and not isinstance(value, {"bytes": bytes, "tuple": tuple,
                                                                      "list": list}[ctype]):
        raise TypeError(f"Argument '{name}' has incorrect type (expected {ctype}, got {type(value).__name__})")
    elif ctype == "NcclConfig" and value is not None and not isinstance(value, NcclConfig):
        raise TypeError(f"Argument '{name}' has incorrect type (expected NcclConfig, got {type(value).__name__})")
    return value


def bind(fname, params, args, kwargs):
    """The arguments of a call, in the real parameter order, converted, or Cython's TypeError."""
    required = sum(d is inspect.Parameter.empty for _, _, d in params)
    given = dict(zip((p[1] for p in params), args))
    for key, value in kwargs.items():
        if key not in [p[1] for p in params]:
            raise TypeError(f"{fname}() got an unexpected keyword argument '{key}'")
        if key in given:
            raise TypeError(f"{fname}() got multiple values for keyword argument '{key}'")
        given[key] = value
    if len(args) > len(params) or any(p[1] not in given for p in params[:required]):
        if not params:
            raise TypeError(f"{fname}() takes no arguments ({len(args)} given)")
        howmany = "exactly" if required == len(params) else ("at most" if len(args) > len(params) else "at least")
        n = len(params) if howmany != "at least" else required
        raise TypeError(f"{fname}() takes {howmany} {n} positional argument{'s' * (n != 1)} ({len(args)} given)")
    return [_convert(fname, t, name, given[name]) if name in given else (None if d == "None" else d)
            for t, name, d in params]


def checked(real, method=True):
    """Give a double's function the real one's parameter list; refuse to import if the two differ."""
    fname, params = signature(real)

    def wrap(fn):
        mine = [p for p in inspect.signature(fn).parameters if p != "self"]
        if mine != [p[1] for p in params]:
            raise ImportError(f"GPU double: the real CuPy's {fname}({', '.join(p[1] for p in params)}) "
                              f"no longer matches the double's ({', '.join(mine)})")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            head = args[:1] if method else ()
            return fn(*head, *bind(fname, params, args[len(head):], kwargs))
        call.real_params = params
        return call
    return wrap


# ---- module functions ------------------------------------------------------------------------------

_group = {"depth": 0, "work": {}}  # open groupStart()s; stream -> [ops, written allocations]


@checked(_real.get_unique_id, method=False)
def get_unique_id():
    uid = os.urandom(128)  # the real type of the id (bytes from CuPy 14, a tuple of ints before)
    return uid if signature(_real.NcclCommunicator)[1][1][0] == "bytes" else tuple(b - 128 for b in uid)


@checked(_real.get_build_version, method=False)
def get_build_version():
    return _real.get_build_version()


@checked(_real.get_version, method=False)
def get_version():
    return _real.get_build_version()  # the version the real module was built against


@checked(_real.groupStart, method=False)
def groupStart():
    _group["depth"] += 1


@checked(_real.groupEnd, method=False)
def groupEnd():
    if _group["depth"] == 0:
        raise _error(INVALID_USAGE, "groupEnd() without groupStart()")
    _group["depth"] -= 1
    if _group["depth"] == 0:
        work, _group["work"] = _group["work"], {}
        for stream, (ops, written) in work.items():
            _enqueue(stream, ops, written, grouped=True)


def _enqueue(stream, ops, written, grouped):
    n = _stream.enqueue(stream, lambda: _execute(ops, grouped))
    for alloc in written:
        alloc.stream, alloc.seq = stream, n


def _mpi_has(dtype):
    """Whether this MPI library has a datatype for `dtype`: float16 has none where mpi4py is built on an
    MPI without MPIX_C_FLOAT16 (Debian's Open MPI 4.1), and NCCL moves and reduces every type."""
    from mpi4py import MPI
    return dtype.char in MPI._typedict


def _bytes(a):
    """a, or a view of its bytes where this MPI library has no datatype for it."""
    return a if _mpi_has(a.dtype) else a.view(np.uint8)


def _reduced(comm, src, op):
    """Every rank's src reduced by `op` (an MPI op) in NumPy, rank after rank: for a type this MPI library
    has no datatype for."""
    from mpi4py import MPI
    parts = np.empty((comm.Get_size(), src.nbytes), np.uint8)
    comm.Allgather(np.ascontiguousarray(src).view(np.uint8).reshape(-1), parts)
    parts = parts.view(src.dtype).reshape(comm.Get_size(), *src.shape)
    ufunc = next(f for o, f in ((MPI.SUM, np.add), (MPI.PROD, np.multiply), (MPI.MAX, np.maximum),
                                (MPI.MIN, np.minimum)) if o == op)
    out = parts[0].copy()
    for part in parts[1:]:
        out = ufunc(out, part)
    return out


def _execute(ops, grouped):
    """Run queued NCCL work over MPI: grouped sends and receives all in flight at once, then collectives."""
    from mpi4py import MPI
    if not grouped:
        kind, comm, a, b = ops[0]
        return (comm.Ssend(_bytes(a), dest=b) if kind == "send" else comm.Recv(_bytes(a), source=b)
                if kind == "recv" else a())
    reqs = [comm.Isend(_bytes(a), dest=b) if kind == "send" else comm.Irecv(_bytes(a), source=b)
            for kind, comm, a, b in ops if kind in ("send", "recv")]
    MPI.Request.Waitall(reqs)
    for kind, _, run, _ in ops:
        if kind == "collective":
            run()


def __getattr__(name):
    raise AttributeError(f"module 'cupy.cuda.nccl' (GPU double) has no attribute {name!r}")


# ---- the communicator ------------------------------------------------------------------------------

class NcclCommunicator:
    """One rank's NCCL communicator, over an MPI communicator of its members (one node only)."""

    @checked(_real.NcclCommunicator)
    def __init__(self, ndev, commId, rank, config=None):
        from mpi4py import MPI
        if ndev < 1 or not 0 <= rank < ndev:
            raise _error(INVALID_ARGUMENT, f"NcclCommunicator({ndev}, uid, {rank}): rank out of range")
        key = hashlib.sha256(bytes(b % 256 for b in commId)).hexdigest()[:16]
        root = os.environ.get("TUTOR_GPU_DOUBLE_RUNDIR") or tempfile.gettempdir()
        folder = os.path.join(root, f"nccl-rendezvous-{key}")
        os.makedirs(folder, exist_ok=True)
        mine, tmp = os.path.join(folder, str(rank)), os.path.join(folder, f"{rank}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write(str(MPI.COMM_WORLD.rank))
        try:
            os.link(tmp, mine)  # fails if another process already joined as this rank
        except FileExistsError:
            raise _error(INVALID_USAGE, f"NcclCommunicator: NCCL rank {rank} joined twice") from None
        finally:
            os.unlink(tmp)
        deadline = time.monotonic() + TIMEOUT_S
        while len([f for f in os.listdir(folder) if f.isdigit()]) < ndev:
            if time.monotonic() > deadline:
                raise _error(SYSTEM_ERROR, f"NcclCommunicator({ndev}, uid, {rank}): only "
                             f"{len(os.listdir(folder))} of {ndev} ranks joined within {TIMEOUT_S:g}s "
                             f"(the double meets on one node only, through {folder})")
            time.sleep(0.005)
        world_ranks = []
        for r in range(ndev):
            with open(os.path.join(folder, str(r))) as f:
                world_ranks.append(int(f.read()))
        group = MPI.COMM_WORLD.Get_group().Incl(world_ranks)
        self._comm = MPI.COMM_WORLD.Create_group(group, tag=int(key[:4], 16) % 32768)
        group.Free()
        self._comm.Barrier()  # every member has read the folder
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        self._rank, self._size, self._device, self._live = rank, ndev, runtime.getDevice(), True

    def __getattr__(self, name):
        raise AttributeError(f"'NcclCommunicator' (GPU double) has no attribute {name!r}")

    @property
    def comm(self):
        return id(self)  # the real one is the ncclComm_t handle

    @checked(_real.NcclCommunicator.rank_id)
    def rank_id(self):
        return self._rank

    @checked(_real.NcclCommunicator.size)
    def size(self):
        return self._size

    @checked(_real.NcclCommunicator.device_id)
    def device_id(self):
        return self._device

    @checked(_real.NcclCommunicator.destroy)
    def destroy(self):
        self._live = False

    @checked(_real.NcclCommunicator.abort)
    def abort(self):
        self._live = False

    @checked(_real.NcclCommunicator.check_async_error)
    def check_async_error(self):
        pass

    # -- the pieces every call is checked with, at the call (as NCCL checks its arguments) --

    def _stream_of(self, call, ptr):
        if not self._live:
            raise _error(INVALID_ARGUMENT, f"{call}: the communicator was destroyed")
        stream = _stream.from_ptr(ptr)
        if stream is None:
            raise _error(INVALID_ARGUMENT, f"{call}: 0x{ptr:x} is no stream's .ptr")
        return stream

    def _rank_arg(self, call, what, r):
        if not 0 <= r < self._size:
            raise _error(INVALID_ARGUMENT, f"{call}: {what} {r} is not a rank of this {self._size}-rank communicator")
        return r

    def _buf(self, call, stream, ptr, count, datatype, written=None):
        """A NumPy view of (ptr, count, datatype), checked for bounds and for a race with another stream."""
        if datatype == globals().get("NCCL_BFLOAT16"):
            raise NotImplementedError(f"GPU double: {call}: bfloat16 is not simulated")
        if datatype not in _DTYPES:
            raise _error(INVALID_ARGUMENT, f"{call}: {datatype} is not an NCCL datatype")
        if count == 0:
            return np.empty(0, _DTYPES[datatype])
        found = memory.view(ptr, count, _DTYPES[datatype])
        if found is None:
            raise memory.DoubleFault(f"{call}: out of bounds: {count} x {np.dtype(_DTYPES[datatype]).name} at "
                                     f"0x{ptr:x} reaches outside every live array ({memory.describe(ptr)})")
        view, alloc = found
        _stream.check_order(stream, alloc, call)
        if written is not None:
            written.append(alloc)
        return view

    def _op(self, call, op):
        if op not in _OPS:
            raise _error(INVALID_ARGUMENT, f"{call}: {op} is not an NCCL reduction op")
        from mpi4py import MPI
        return getattr(MPI, "SUM" if _OPS[op] == "AVG" else _OPS[op]), _OPS[op] == "AVG"

    def _average(self, out):
        if out.dtype.kind == "f":
            out /= self._size
        else:  # integer average: C division, rounding toward zero
            out[...] = np.sign(out) * (np.abs(out) // self._size)

    def _issue(self, stream, ops, written):
        if _group["depth"]:
            work = _group["work"].setdefault(stream, ([], []))
            work[0].extend(ops)
            work[1].extend(written)
        else:
            _enqueue(stream, ops, written, grouped=False)

    def _collective(self, stream, run, written):
        self._issue(stream, [("collective", self._comm, run, None)], written)

    # -- the calls --

    @checked(_real.NcclCommunicator.allReduce)
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        call, s, out = "allReduce", self._stream_of("allReduce", stream), []
        mpi_op, avg = self._op(call, op)
        src = self._buf(call, s, sendbuf, count, datatype)
        dst = self._buf(call, s, recvbuf, count, datatype, out)

        def run():
            if _mpi_has(src.dtype):
                self._comm.Allreduce(np.array(src), dst, op=mpi_op)  # a copy: in place is safe
            else:
                dst[...] = _reduced(self._comm, src, mpi_op)
            avg and self._average(dst)
        self._collective(s, run, out)

    @checked(_real.NcclCommunicator.reduce)
    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        call, s, out = "reduce", self._stream_of("reduce", stream), []
        mpi_op, avg = self._op(call, op)
        root = self._rank_arg(call, "root", root)
        src = self._buf(call, s, sendbuf, count, datatype)
        dst = self._buf(call, s, recvbuf, count, datatype, out) if self._rank == root else None

        def run():  # recvbuf is used on the root only, as in NCCL
            if _mpi_has(src.dtype):
                self._comm.Reduce(np.array(src), dst, op=mpi_op, root=root)
            else:  # every rank reduces; the root keeps it
                whole = _reduced(self._comm, src, mpi_op)
                if dst is not None:
                    dst[...] = whole
            avg and dst is not None and self._average(dst)
        self._collective(s, run, out)

    @checked(_real.NcclCommunicator.bcast)
    def bcast(self, buff, count, datatype, root, stream):
        call, s, out = "bcast", self._stream_of("bcast", stream), []
        root = self._rank_arg(call, "root", root)
        buf = self._buf(call, s, buff, count, datatype, out if self._rank != root else None)
        self._collective(s, lambda: self._comm.Bcast(_bytes(buf), root=root), out)

    @checked(_real.NcclCommunicator.broadcast)
    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        call, s, out = "broadcast", self._stream_of("broadcast", stream), []
        root = self._rank_arg(call, "root", root)
        src = self._buf(call, s, sendbuff, count, datatype) if self._rank == root else None
        dst = self._buf(call, s, recvbuff, count, datatype, out)

        def run():  # sendbuff is used on the root only
            if src is not None:
                dst[...] = src
            self._comm.Bcast(_bytes(dst), root=root)
        self._collective(s, run, out)

    @checked(_real.NcclCommunicator.allGather)
    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        call, s, out = "allGather", self._stream_of("allGather", stream), []
        src = self._buf(call, s, sendbuf, count, datatype)
        dst = self._buf(call, s, recvbuf, count * self._size, datatype, out)
        self._collective(s, lambda: self._comm.Allgather(_bytes(np.array(src)), _bytes(dst)), out)

    @checked(_real.NcclCommunicator.reduceScatter)
    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        call, s, out = "reduceScatter", self._stream_of("reduceScatter", stream), []
        mpi_op, avg = self._op(call, op)
        src = self._buf(call, s, sendbuf, recvcount * self._size, datatype)
        dst = self._buf(call, s, recvbuf, recvcount, datatype, out)

        def run():
            if _mpi_has(src.dtype):
                self._comm.Reduce_scatter_block(np.array(src), dst, op=mpi_op)
            else:
                dst[...] = _reduced(self._comm, src, mpi_op).reshape(self._size, -1)[self._rank]
            avg and self._average(dst)
        self._collective(s, run, out)

    @checked(_real.NcclCommunicator.send)
    def send(self, sendbuf, count, datatype, peer, stream):
        s = self._stream_of("send", stream)
        peer = self._rank_arg("send", "peer", peer)
        self._issue(s, [("send", self._comm, self._buf("send", s, sendbuf, count, datatype), peer)], [])

    @checked(_real.NcclCommunicator.recv)
    def recv(self, recvbuf, count, datatype, peer, stream):
        s, out = self._stream_of("recv", stream), []
        peer = self._rank_arg("recv", "peer", peer)
        self._issue(s, [("recv", self._comm, self._buf("recv", s, recvbuf, count, datatype, out), peer)], out)
