"""The GPU double's `cupy`: NumPy underneath, CuPy's rules on top. Loaded only by tests, through
tests/gpu_double.env() (PYTHONPATH), so the lessons' CuPy + NCCL path runs on a machine without a GPU.

cupy.ndarray wraps a NumPy array; it is not one (as a real CuPy array is not): NumPy will not take it
without .get(), and mixing it with a NumPy array raises TypeError, as on a GPU. Its operations run at
once on the host, but first run the NCCL work queued on the current stream (see cupy.cuda.stream).
Functions not written out here fall back to NumPy's of the same name, where the real CuPy has that name.
"""
import importlib.metadata
import json
import os

import numpy as np

from cupy import cuda
from cupy.cuda import memory as _memory, stream as _stream
from cupy.cuda.memory import get_default_memory_pool  # noqa: F401


def _real_version():
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return "0"


__version__ = f"{_real_version()} (GPU double)"
_names_file = os.environ.get("TUTOR_GPU_DOUBLE_NAMES")
_REAL = None  # the real cupy's names (gpu_double.env() lists them); None: every NumPy name
if _names_file and os.path.exists(_names_file):
    with open(_names_file) as _f:
        _REAL = json.load(_f)
_VIEWS = {"reshape", "view", "transpose", "squeeze", "swapaxes", "ravel", "T"}  # no kernel: no flush
_HOST_READS = {"item", "tolist", "tobytes"}


def _garbage(a):
    """Fresh device memory is not zeroed: fill it with 0xA5 bytes, so a read of bytes nobody wrote
    (a count or dtype that covers too little) shows up as a wrong value, not as a lucky zero."""
    a.view(np.uint8).fill(0xA5) if a.flags.c_contiguous or a.flags.f_contiguous else None
    return a


class ndarray:
    """A device array of the double: .data.ptr, .get(), and NumPy's arithmetic under CuPy's rules."""
    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("GPU double: ndarray(memptr=..., strides=...) is not simulated")
        self._a = _garbage(np.empty(shape, dtype, order=order))
        _memory.register(self._a)

    @classmethod
    def _of(cls, a):
        obj = cls.__new__(cls)
        obj._a = a
        return obj

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    data = property(lambda self: _memory.MemoryPointer(self._a.__array_interface__["data"][0]))
    device = property(lambda self: cuda.Device())

    def get(self, stream=None, order="C", out=None, blocking=True):
        """Device to host. The double does not sync here: sync the stream before the host reads."""
        if out is not None:
            out[...] = self._a
            return out
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        _kernel(np.copyto, self, np.asarray(arr), host_ok=True, wrote=(self,))

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _kernel(getattr(ufunc, method), *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _kernel(func, *args, **kwargs)

    def __getitem__(self, key):
        basic = all(k is None or k is Ellipsis or isinstance(k, (int, np.integer, slice))
                    for k in (key if isinstance(key, tuple) else (key,)))
        return _wrap(self._a[key]) if basic else _kernel(lambda a: a[key], self)

    def __setitem__(self, key, value):
        _kernel(lambda a, v: a.__setitem__(key, v), self, value, host_ok=True, wrote=(self,))

    def __getattr__(self, name):
        if name.startswith("_") or not hasattr(self._a, name) or (_REAL and name not in _REAL["ndarray"]):
            raise AttributeError(f"'cupy.ndarray' (GPU double) has no attribute {name!r}")
        attr = getattr(self._a, name)
        if name in _HOST_READS:
            return attr
        if not callable(attr):
            return _wrap(attr)
        if name in _VIEWS:
            return lambda *args, **kw: _wrap(attr(*_unwrap(args), **_unwrap(kw)))
        return lambda *args, **kw: _kernel(getattr(np.ndarray, name), self, *args, **kw)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return repr(self._a)

    def __str__(self):
        return str(self._a)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __bool__(self):
        return bool(self._a)

    def __index__(self):
        return self._a.__index__()

    def __complex__(self):
        return complex(self._a)


def _binary(ufunc):
    return (lambda self, other: _kernel(ufunc, self, other),
            lambda self, other: _kernel(ufunc, other, self),
            lambda self, other: _kernel(ufunc, self, other, out=self))


for _name, _ufunc in {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
                      "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power,
                      "matmul": np.matmul, "and": np.bitwise_and, "or": np.bitwise_or,
                      "xor": np.bitwise_xor, "lshift": np.left_shift, "rshift": np.right_shift}.items():
    for _prefix, _op in zip(("", "r", "i"), _binary(_ufunc)):
        setattr(ndarray, f"__{_prefix}{_name}__", _op)
for _name, _ufunc in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                      "eq": np.equal, "ne": np.not_equal}.items():
    setattr(ndarray, f"__{_name}__", _binary(_ufunc)[0])
for _name, _ufunc in {"neg": np.negative, "pos": np.positive, "abs": np.absolute,
                      "invert": np.invert}.items():
    setattr(ndarray, f"__{_name}__", lambda self, _ufunc=_ufunc: _kernel(_ufunc, self))
ndarray.__hash__ = None


def _unwrap(x, host_ok=False):
    """Arguments for NumPy: our arrays' NumPy arrays; a NumPy array is refused as CuPy refuses it."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and not host_ok:
        raise TypeError(f"Unsupported type {type(x)} (GPU double: cupy does not take NumPy arrays; "
                        "cupy.asarray() them first)")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, host_ok) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v, host_ok) for k, v in x.items()}
    return x


def _wrap(x, writer=None):
    """NumPy results as our arrays; fresh memory becomes an allocation written by `writer`."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if isinstance(x, np.ndarray):
        if _memory.owner(x) is None:
            _memory.register(x, *(writer or _stream.kernel()))
        return ndarray._of(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap(v, writer) for v in x)
    return x


def _kernel(fn, *args, host_ok=False, wrote=(), **kwargs):
    """Run fn as a CuPy operation on the current stream: after that stream's queued NCCL work.
    Arrays it writes (out=, wrote=) are recorded as written on that stream."""
    writer = _stream.kernel()
    out = kwargs.get("out")
    written = [o for o in (*wrote, *(out if isinstance(out, tuple) else (out,))) if isinstance(o, ndarray)]
    result = fn(*_unwrap(args, host_ok), **_unwrap(kwargs))
    for o in written:
        _memory.owner(o._a).stream, _memory.owner(o._a).seq = writer
    for o in written:
        if result is o._a:
            return o
    return _wrap(result, writer)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    """Host (or device) data copied into a new device array, on the current stream."""
    writer = _stream.kernel()
    host = obj._a if isinstance(obj, ndarray) else obj
    return _wrap(np.array(host, dtype=dtype, order=order, ndmin=ndmin), writer)


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray) and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype, order=order or "K")


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """Device to host, without a sync (the double's rule: sync before the host reads)."""
    return a.get(order=order, out=out) if isinstance(a, ndarray) else np.asarray(a, order=order)


def empty(shape, dtype=float, order="C"):
    """Memory, no kernel: nothing queued runs and nothing counts as written."""
    return ndarray(shape, dtype, order=order)


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    a = _garbage(np.empty_like(_unwrap(prototype), dtype=dtype, order=order, shape=shape))
    _memory.register(a)
    return ndarray._of(a)


def get_array_module(*args):
    return __import__("cupy") if any(isinstance(a, ndarray) for a in args) else np


def __getattr__(name):
    """NumPy's function of the same name as a CuPy operation, where the real CuPy has the name."""
    attr = getattr(np, name, None) if not name.startswith("_") else None
    if attr is None or (_REAL and name not in _REAL["cupy"]) or type(attr) is type(np):
        raise AttributeError(f"module 'cupy' (GPU double) has no attribute {name!r}")
    if not callable(attr) or isinstance(attr, type):
        return attr  # dtypes (cupy.float32 is numpy.float32) and constants

    def call(*args, **kwargs):
        return _kernel(attr, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    globals()[name] = call
    return call
