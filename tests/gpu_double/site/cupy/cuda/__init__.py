"""cupy.cuda of the GPU double: streams, events, devices, the runtime; nccl loads on first use."""
import importlib

from cupy.cuda import memory, runtime, stream  # noqa: F401
from cupy.cuda.device import Device, get_device_id  # noqa: F401
from cupy.cuda.memory import MemoryPointer, MemoryPool  # noqa: F401
from cupy.cuda.stream import Event, Stream, get_current_stream  # noqa: F401


def is_available():
    try:
        return runtime.getDeviceCount() > 0
    except runtime.CUDARuntimeError:
        return False


def __getattr__(name):
    if name == "nccl":  # not at import: it needs the stub libnccl (cupy imports fine without it)
        return importlib.import_module("cupy.cuda.nccl")
    raise AttributeError(f"module 'cupy.cuda' (GPU double) has no attribute {name!r}")
