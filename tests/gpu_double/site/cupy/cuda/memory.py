"""The double's device memory: each array lives in a NumPy buffer, registered here while it is alive.

An allocation knows its address range (so an NCCL pointer reaching outside every live allocation
faults, as on a GPU) and the stream and sequence number of its last write (so NCCL using it from
another stream, unordered, is caught instead of racing silently).
"""
import weakref

import numpy as np

_live = {}  # id(root NumPy array) -> Allocation


class DoubleFault(RuntimeError):
    """What a GPU would fault on (a pointer out of bounds) or race over (unordered streams)."""


class Allocation:
    def __init__(self, root, stream, seq):
        self.ptr, self.nbytes, self.ref = root.__array_interface__["data"][0], root.nbytes, weakref.ref(root)
        self.stream, self.seq = stream, seq  # last write: its stream (None: never written) and number


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def owner(a):
    """The Allocation holding NumPy array `a`, or None when `a` is fresh memory."""
    return _live.get(id(_root(a)))


def register(a, stream=None, seq=None):
    """Make fresh NumPy array `a` (and what it views) an allocation, written by (stream, seq)."""
    root = _root(a)
    alloc = _live[id(root)] = Allocation(root, stream, seq)
    weakref.finalize(root, _live.pop, id(root), None)
    return alloc


def view(ptr, count, dtype):
    """(NumPy view of `count` items of `dtype` at address ptr, its Allocation), or None when the
    range reaches outside every live allocation. The view keeps the allocation alive."""
    nbytes = count * np.dtype(dtype).itemsize
    for alloc in list(_live.values()):
        if alloc.ptr <= ptr and ptr + nbytes <= alloc.ptr + alloc.nbytes:
            flat = alloc.ref().reshape(-1, order="A").view(np.uint8)
            return flat[ptr - alloc.ptr:ptr - alloc.ptr + nbytes].view(dtype), alloc
    return None


def describe(ptr):
    """Where ptr lies, for an error message."""
    for alloc in _live.values():
        if alloc.ptr <= ptr < alloc.ptr + max(alloc.nbytes, 1):
            return f"{alloc.ptr + alloc.nbytes - ptr} bytes are left in its allocation from there"
    return "it lies in no live allocation"


class MemoryPointer:
    """x.data: where an array's first item lives (a host address in the double)."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __int__(self):
        return self.ptr

    def __repr__(self):
        return f"<MemoryPointer 0x{self.ptr:x} (GPU double)>"


class MemoryPool:
    """cupy.get_default_memory_pool(): live arrays' bytes, each rounded up to 512 as CuPy's pool does."""

    def used_bytes(self):
        return sum(-(-a.nbytes // 512) * 512 for a in _live.values())

    def total_bytes(self):
        return self.used_bytes()

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def n_free_blocks(self):
        return 0


_pool = MemoryPool()


def get_default_memory_pool():
    return _pool
