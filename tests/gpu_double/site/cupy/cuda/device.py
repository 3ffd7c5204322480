"""cupy.cuda.Device of the GPU double (a thread's current device, as in CUDA)."""
from cupy.cuda import runtime, stream


class Device:
    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else int(device)

    def use(self):
        runtime.setDevice(self.id)  # an id past the visible GPUs raises cudaErrorInvalidDevice

    def synchronize(self):
        stream.synchronize_all()

    @property
    def compute_capability(self):
        return "90"

    def __enter__(self):
        self._previous = runtime.getDevice()
        self.use()
        return self

    def __exit__(self, *exc):
        runtime.setDevice(self._previous)

    def __int__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return self.id

    def __repr__(self):
        return f"<CUDA Device {self.id} (GPU double)>"


def get_device_id():
    return runtime.getDevice()
