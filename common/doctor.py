"""`bin/tutor doctor`: what this machine can do, and what `--device auto` will choose and why."""
import os
import platform
import subprocess
import sys
import time

from common import devices, launch


def line(name, value):
    print(f"  {name:<22} {value}")


def main():
    print("python")
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    line("interpreter", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})")
    line("GIL", "enabled" if gil else "disabled (free-threaded build)")
    line("usable cores", f"{launch.usable_cores()} of {os.cpu_count()}")
    print("mpi")
    problems = 0
    try:
        import mpi4py
        mpi4py.rc.initialize = False  # the library version is readable before MPI_Init
        from mpi4py import MPI
        line("mpi4py", mpi4py.__version__)
        line("MPI library", MPI.Get_library_version().strip().splitlines()[0])
        line("MPI standard", "%d.%d" % MPI.Get_version())
    except Exception as exc:
        problems += 1
        line("mpi4py", f"NOT USABLE: {type(exc).__name__}: {exc}")
    try:
        argv = launch.mpiexec(1)
        line("mpiexec", " ".join(argv))
        probe = "from mpi4py import MPI; print(MPI.Query_thread(), MPI.THREAD_MULTIPLE)"
        t0 = time.monotonic()
        out = subprocess.run([*argv, "-n", "1", launch.python(), "-c", probe], capture_output=True,
                             text=True, timeout=60)
        level, multiple = (int(x) for x in out.stdout.split())
        names = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}
        line("thread level", f"{names.get(level, level)} (a 1-rank launch took {time.monotonic() - t0:.1f} s)")
    except Exception as exc:
        problems += 1
        line("mpiexec", f"NOT USABLE: {exc}")
    print("torch")
    try:
        import torch
        import torch.distributed as dist
        line("torch", torch.__version__)
        line("gloo / nccl", f"{dist.is_gloo_available()} / {dist.is_nccl_available()}")
        line("CUDA", f"{torch.cuda.is_available()} ({torch.cuda.device_count()} device(s))")
    except Exception as exc:
        line("torch", f"NOT USABLE: {type(exc).__name__}: {exc}")
    print("gpu")
    n, why = devices.visible_gpus()
    line("GPUs visible", why)
    if n:
        try:
            import cupy
            from cupy.cuda import nccl
            line("CuPy", cupy.__version__)
            line("NCCL (CuPy)", nccl.get_version())
        except Exception as exc:
            line("CuPy / NCCL", f"NOT USABLE: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    else:
        line("CuPy / NCCL", "not probed (no GPU)")
    print("--device auto will choose")
    for api in devices.APIS:
        ready, reason = devices.gpu_ready(api, 1) if n else (False, why)
        line(f"--api {api}", f"{'gpu' if ready else 'cpu'}: {reason}" +
             (f" (up to {n} rank(s) per node)" if ready else ""))
    return 1 if problems else 0
