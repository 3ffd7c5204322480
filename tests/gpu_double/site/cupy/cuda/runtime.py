"""cupy.cuda.runtime of the GPU double: TUTOR_GPU_DOUBLE_GPUS physical GPUs, CUDA_VISIBLE_DEVICES honoured.

Device i is the i-th visible GPU (CUDA_VISIBLE_DEVICES="3,5": device 0 is physical GPU 3), and
deviceGetPCIBusId names the physical GPU, so two ranks that share one show the same bus id.
"""
import os
import threading

from cupy.cuda import stream as _stream

try:  # the real error class, so messages read as CuPy's do ("cudaErrorInvalidDevice: ...")
    from cupy_backends.cuda.api.runtime import CUDARuntimeError
except ImportError:  # pragma: no cover - the real CuPy is there whenever the double is used
    class CUDARuntimeError(RuntimeError):
        NAMES = {35: "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
                     "version",
                 100: "cudaErrorNoDevice: no CUDA-capable device is detected",
                 101: "cudaErrorInvalidDevice: invalid device ordinal"}

        def __init__(self, status):
            self.status = status
            super().__init__(self.NAMES.get(status, f"cudaError {status}"))

is_hip = False
_local = threading.local()


def _visible():
    """Physical ids of the visible GPUs, in device order (CUDA stops at the first bad entry)."""
    physical = int(os.environ.get("TUTOR_GPU_DOUBLE_GPUS", "8"))
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return list(range(physical))
    seen = []
    for entry in (e.strip() for e in cvd.split(",")):
        gpu = int(entry) if entry.isdigit() else (int(entry[11:]) if entry.startswith("GPU-double-")
                                                  and entry[11:].isdigit() else -1)
        if not 0 <= gpu < physical or gpu in seen:
            break
        seen.append(gpu)
    return seen


# the newest CUDA each driver branch runs (nvidia-smi's "CUDA Version"), newest first
_DRIVER_CUDA = ((580, 13000), (570, 12080), (550, 12040), (525, 12000), (0, 11080))


def driverGetVersion():
    """The newest CUDA the stand-in driver (TUTOR_GPU_DOUBLE_DRIVER, as nvidia-smi says it) runs."""
    branch = int(os.environ.get("TUTOR_GPU_DOUBLE_DRIVER", "580.95.05").split(".")[0])
    return next(cuda for least, cuda in _DRIVER_CUDA if branch >= least)


def runtimeGetVersion():
    return 13000  # the double stands in for cupy-cuda13x


def _driver_suffices():
    """CUDA's minor-version compatibility: any driver of the runtime's major will do, an older one not."""
    if driverGetVersion() // 1000 < runtimeGetVersion() // 1000:
        raise CUDARuntimeError(35)  # cudaErrorInsufficientDriver


def _physical(device):
    _driver_suffices()
    visible = _visible()
    if not isinstance(device, int) or not 0 <= device < len(visible):
        raise CUDARuntimeError(101)  # cudaErrorInvalidDevice
    return visible[device]


def getDeviceCount():
    _driver_suffices()
    n = len(_visible())
    if n == 0:
        raise CUDARuntimeError(100)  # cudaErrorNoDevice, as CUDA says when it sees none
    return n


def getDevice():
    return getattr(_local, "device", 0)


def setDevice(device):
    _physical(device)
    _local.device = device


def deviceGetPCIBusId(device):
    return f"0000:{0x18 + _physical(device):02X}:00.0"


def getDeviceProperties(device):
    gpu = _physical(device)
    return {"name": b"Double GPU", "totalGlobalMem": 80 * 2**30, "multiProcessorCount": 132,
            "major": 9, "minor": 0, "pciBusID": 0x18 + gpu, "pciDeviceID": 0, "pciDomainID": 0,
            "uuid": f"GPU-double-{gpu:04d}".encode()}


def deviceSynchronize():
    _stream.synchronize_all()


def __getattr__(name):
    raise AttributeError(f"module 'cupy.cuda.runtime' (GPU double) has no attribute {name!r}")
