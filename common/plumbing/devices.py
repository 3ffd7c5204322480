"""Which device a run can use: cheap probes first, the GPU libraries only when a GPU is there.

Used by the lessons (each rank decides, then all ranks agree) and by `bin/tutor` (pre-checks, doctor).
Nothing here imports torch or CuPy unless a GPU has been seen, so a CPU run pays nothing for it.
"""
import functools
import glob
import os
import shutil
import subprocess
import warnings

from common.plumbing import driver

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


@functools.lru_cache(maxsize=None)
def nccl_loads():
    """(ok, why): does CuPy's NCCL module load? CuPy's own many-line warning becomes one reason."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        from cupy.cuda import nccl
    if nccl.available:  # else CuPy stands in an empty module: libnccl did not load
        return True, "loads"
    reason = [ln.strip() for w in said for ln in str(w.message).splitlines() if ln.startswith("Reason: ")]
    return False, ("CuPy cannot load NCCL" + (f": {reason[0][len('Reason: '):]}" if reason else "") +
                   " (torch's CUDA build brings libnccl: run make setup on the GPU machine)")


def _probe_cupy(local_rank):
    import cupy
    ok, why = nccl_loads()
    if not ok:
        return False, why, None
    from cupy.cuda import nccl
    count = cupy.cuda.runtime.getDeviceCount()  # what this process sees: CUDA_VISIBLE_DEVICES, cgroups
    if count == 0:
        return False, "CuPy sees no GPU in this process", None
    gpu = local_rank % count
    with cupy.cuda.Device(gpu):
        float((cupy.arange(64, dtype=cupy.float32) * 2).sum())  # a kernel: CuPy compiles it (NVRTC)
        a = cupy.ones((8, 8), dtype=cupy.float32)
        float(cupy.matmul(a, a)[0, 0])                            # cuBLAS
        nccl.get_version()
        return True, count, (gpu, cupy.cuda.runtime.deviceGetPCIBusId(gpu))


def _probe_torch(local_rank):
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} cannot use CUDA (CPU-only build or driver mismatch)", None
    if not dist.is_nccl_available():
        return False, f"torch {torch.__version__} was built without NCCL", None
    count = torch.cuda.device_count()
    gpu = local_rank % count
    x = torch.arange(64, dtype=torch.float32, device=f"cuda:{gpu}")
    float((x * 2).sum())
    a = torch.ones(8, 8, device=f"cuda:{gpu}")
    float((a @ a)[0, 0])                                          # cuBLAS
    # the PCI bus id, as on the CuPy path: MIG slices of one GPU have UUIDs of their own but share it,
    # and NCCL refuses two ranks on one bus id ("Duplicate GPU detected")
    p = torch.cuda.get_device_properties(gpu)
    return True, count, (gpu, f"{p.pci_domain_id:04X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0")


PROBES = {"cupy": _probe_cupy, "torch": _probe_torch}


def stacks(api, uses_torch=False):
    """The GPU libraries a run drives: torch's on --api torch, CuPy's on mpi4py (and torch's too when the
    lesson computes with torch on the GPU, as lesson 08 does)."""
    return ("torch",) if api == "torch" else ("cupy", "torch") if uses_torch else ("cupy",)


def node_gpus():
    """(GPUs seen, why, driver.gap's line or None): what one rank per node asks nvidia-smi."""
    n, why = visible_gpus()
    return n, why, driver.gap(driver.version(), driver.cuda_wheels()) if n else None


def probe(names, local_rank, gap=None):
    """(ok, why, gpu, gpu_id): can this rank drive GPU local_rank % (GPUs it sees) through every stack
    in `names`? Runs what the lessons run (a kernel, a matmul, NCCL loading), not just the imports.
    gpu_id names the physical GPU, so ranks of one node can tell whether they would share one.
    gap: driver.gap's line for this node. The probe still runs (CUDA's forward-compatibility libraries
    can make an old driver do), quietly (torch warns of the driver on every rank), and a failure is
    told as that line, which says what to do, instead of CUDA's raw error."""
    with warnings.catch_warnings():
        if gap:
            warnings.simplefilter("ignore")
        ok, why, gpu, gpu_id = _probe(names, local_rank)
    return ok, why if ok or not gap else gap, gpu, gpu_id


def _probe(names, local_rank):
    gpu = gpu_id = None
    for name in names:
        try:
            ok, count, found = PROBES[name](local_rank)
        except Exception as exc:  # any import / driver / compiler failure means "not usable", with its reason
            first = (str(exc).strip().splitlines() or [""])[0]
            return False, f"{name} GPU stack not usable: {type(exc).__name__}: {first}", None, None
        if not ok:
            return False, count, None, None
        if gpu is None:
            gpu, gpu_id, seen = found[0], found[1], count
    return True, f"{seen} GPU(s) visible to rank, NCCL loads", gpu, gpu_id


def shared(gpu_ids, seen):
    """The line refusing a node where two ranks would drive one GPU (None when every rank has its own).
    gpu_ids: each local rank's physical GPU; seen: how many GPUs local rank 0 found."""
    first = {}
    for rank, gid in enumerate(gpu_ids):
        if gid in first:
            return (f"{len(gpu_ids)} ranks on this node but {seen} GPU(s): ranks {first[gid]} and {rank} "
                    "would share one, and NCCL needs one GPU per rank (lower NP or use --device cpu)")
        first[gid] = rank
    return None


def gpu_ready(api, local_size=1, seen=None, uses_torch=False):
    """(ok, why) for one process: does it see a GPU, and does the GPU stack run on it? (doctor, tests)
    seen: visible_gpus()'s answer when one rank of the node already asked (one nvidia-smi per node)."""
    n, why = seen or visible_gpus()
    if n == 0:
        return False, why
    ok, why, _, _ = probe(stacks(api, uses_torch), 0, driver.gap(driver.version(), driver.cuda_wheels()))
    if ok and local_size > n:
        return False, shared([0] * local_size, n)
    return ok, why


def decide(want, ready, why):
    """(device, reason, error) from the asked-for device and whether every rank found a GPU ready."""
    if want == "cpu":
        return "cpu", "asked for --device cpu", None
    if ready:
        return "gpu", why, None
    if want == "gpu":
        return None, None, f"--device gpu: no usable GPU: {why}"
    return "cpu", f"auto chose cpu: {why}", None
