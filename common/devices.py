"""Which device a run can use: cheap probes first, the GPU libraries only when a GPU is there.

Used by the lessons (each rank decides, then all ranks agree) and by `bin/tutor` (pre-checks, doctor).
Nothing here imports torch or CuPy unless a GPU has been seen, so a CPU run pays nothing for it.
"""
import glob
import os
import shutil
import subprocess

APIS = ("mpi4py", "torch")
DEVICES = ("auto", "cpu", "gpu")
TRANSPORT = {("mpi4py", "cpu"): "mpi", ("mpi4py", "gpu"): "nccl",
             ("torch", "cpu"): "gloo", ("torch", "gpu"): "nccl"}


def visible_gpus():
    """(count, why) of NVIDIA GPUs this process may use, without importing a CUDA library."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "none", "NoDevFiles"):
        return 0, "CUDA_VISIBLE_DEVICES hides every GPU"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15).stdout
            n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            n = 0
    else:
        n = len(glob.glob("/dev/nvidia[0-9]*"))
    if cvd is not None:
        n = min(n, len([d for d in cvd.split(",") if d.strip()]))
    if n == 0:
        return 0, "no NVIDIA GPU found (no nvidia-smi listing, no /dev/nvidia*)"
    return n, f"{n} NVIDIA GPU(s) visible"


def gpu_ready(api, local_size, seen=None):
    """(ok, why): can `local_size` ranks on this node each drive their own GPU through `api`?
    seen: visible_gpus()'s answer when one rank of the node already asked (one nvidia-smi per node)."""
    n, why = seen or visible_gpus()
    if n == 0:
        return False, why
    if local_size > n:
        return False, (f"{local_size} ranks on this node but {n} GPU(s): "
                       "NCCL needs one GPU per rank (lower NP or use --device cpu)")
    try:
        if api == "torch":
            import torch
            import torch.distributed as dist
            if not torch.cuda.is_available():
                return False, f"torch {torch.__version__} cannot use CUDA (CPU-only build or driver mismatch)"
            if not dist.is_nccl_available():
                return False, f"torch {torch.__version__} was built without NCCL"
        else:
            import cupy
            from cupy.cuda import nccl
            if not nccl.available:  # CuPy stands in an empty module when libnccl does not load
                return False, ("CuPy cannot load the NCCL library "
                               "(.venv/bin/pip install -r requirements-gpu.txt)")
            nccl.get_version()
            cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # any import / driver failure means "not usable", with its reason
        first = (str(exc).strip().splitlines() or [""])[0]
        return False, f"{api} GPU stack not usable: {type(exc).__name__}: {first}"
    return True, f"{n} GPU(s) visible, {local_size} rank(s) on this node, NCCL loads"


def decide(want, ready, why):
    """(device, reason, error) from the asked-for device and whether every rank found a GPU ready."""
    if want == "cpu":
        return "cpu", "asked for --device cpu", None
    if ready:
        return "gpu", why, None
    if want == "gpu":
        return None, None, f"--device gpu: no usable GPU: {why}"
    return "cpu", f"auto chose cpu: {why}", None
