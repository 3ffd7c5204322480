"""The GPU double: run the lessons' CuPy + NCCL path on a machine without a GPU.

    from gpu_double import env
    subprocess.run([MPIEXEC, "-n", "2", PY, "-m", "mpi4py", "lessons/00_hello.py", "--device", "gpu"],
                   env={**os.environ, **env(tmp_path)})

env() gives a subprocess (mpiexec and its ranks) a stand-in `cupy` (tests/gpu_double/site, NumPy
underneath) whose `cupy.cuda.nccl` runs NCCL's calls over MPI, and a fake `nvidia-smi` listing `gpus`
GPUs. The stand-in takes NCCL's constants and every call's parameter list from the real compiled
`cupy_backends.cuda.libs.nccl`, loaded against a stub libnccl.so.2 built here once (gcc, nm) and kept
under the temp dir, keyed by the real module's path and mtime, so the double cannot drift from CuPy.
"""
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(ROOT, "tests", "gpu_double", "site")
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")

# what libnccl's ncclGetErrorString says: the real NcclError(status) asks the library for its text
ERRORS = ["no error", "unhandled cuda error", "unhandled system error", "internal error",
          "invalid argument", "invalid usage", "remote process exited or there was a network error",
          "NCCL operation in progress"]

# the real cupy's public names, so the double's NumPy fallback offers only what CuPy has
NAMES_SCRIPT = """
import ctypes, json, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
import cupy
json.dump({"cupy": sorted(n for n in dir(cupy) if not n.startswith("_")),
           "ndarray": sorted(n for n in dir(cupy.ndarray) if not n.startswith("_"))}, sys.stdout)
"""


def real_nccl_module():
    """Path of the real compiled cupy_backends.cuda.libs.nccl, found without importing it."""
    spec = importlib.util.find_spec("cupy_backends")
    found = spec and glob.glob(os.path.join(spec.submodule_search_locations[0], "cuda", "libs", "nccl.*.so"))
    if not found:
        raise RuntimeError("GPU double: the real CuPy (cupy_backends.cuda.libs.nccl) is not installed")
    return found[0]


def stub_source(symbols):
    """C source defining every ncclX the real module links: all succeed, doing nothing."""
    lines = []
    for name in symbols:
        if name == "ncclGetErrorString":
            cases = "".join(f'    case {i}: return "{text}";\n' for i, text in enumerate(ERRORS))
            lines.append(f'const char *{name}(int r) {{\n  switch (r) {{\n{cases}'
                         '    default: return "unknown result code";\n  }\n}')
        else:
            lines.append(f"int {name}(void) {{ return 0; }}")
    return "\n".join(lines) + "\n"


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"GPU double: {' '.join(cmd[:2])} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


@functools.lru_cache(maxsize=None)
def build():
    """(stub libnccl.so.2, real cupy names JSON): built once per real module, then cached."""
    so = real_nccl_module()
    python = PYTHON if os.path.exists(PYTHON) else sys.executable
    with open(__file__, "rb") as f:  # a change to this recipe builds anew
        recipe = hashlib.sha256(f.read()).hexdigest()
    key = hashlib.sha256(f"{so}:{os.stat(so).st_mtime_ns}:{python}:{recipe}".encode()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), f"tutor-gpu-double-{key}")
    lib, names = os.path.join(cache, "libnccl.so.2"), os.path.join(cache, "cupy_names.json")
    if os.path.exists(names):
        return lib, names
    for tool in ("nm", "gcc"):
        if not shutil.which(tool):
            raise RuntimeError(f"GPU double: needs `{tool}` to build its stub libnccl.so.2")
    work = tempfile.mkdtemp(prefix=f"tutor-gpu-double-{key}.")
    symbols = sorted({line.split()[-1] for line in run(["nm", "-D", "--undefined-only", so]).splitlines()
                      if line.split()[-1].startswith("nccl")})
    with open(os.path.join(work, "stub.c"), "w") as f:
        f.write(stub_source(symbols))
    run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", os.path.join(work, "libnccl.so.2"),
         os.path.join(work, "stub.c")])
    out = run([python, "-c", NAMES_SCRIPT, os.path.join(work, "libnccl.so.2")], timeout=120)
    with open(os.path.join(work, "cupy_names.json"), "w") as f:
        json.dump(json.loads(out), f)
    try:  # atomic: a racing builder's identical copy wins, ours is dropped
        os.rename(work, cache)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
    return lib, names


DRIVER = "580.95.05"  # the stand-in driver's version: new enough for CUDA 13 (R580)


def fake_smi(folder, gpus):
    """A folder holding an `nvidia-smi` for `gpus` double GPUs: `-L` lists them, and
    `--query-gpu=driver_version --format=csv,noheader` says $TUTOR_GPU_DOUBLE_DRIVER once per GPU."""
    bindir = os.path.join(folder, f"gpu-double-bin-{gpus}")
    smi = os.path.join(bindir, "nvidia-smi")
    listing = "".join(f'  echo "GPU {i}: Double GPU (UUID: GPU-double-{i:04d})"\n' for i in range(gpus))
    text = ('#!/bin/sh\ncase "$*" in\n*--query-gpu=driver_version*)\n' +
            f'  for i in $(seq {gpus}); do echo "${{TUTOR_GPU_DOUBLE_DRIVER:-{DRIVER}}}"; done ;;\n' +
            f"*)\n{listing}  ;;\nesac\n")
    try:
        with open(smi) as f:
            current = f.read() == text
    except OSError:
        current = False
    if not current:  # written anew when this recipe changes
        os.makedirs(bindir, exist_ok=True)
        tmp = f"{smi}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, smi)
    return bindir


def env(workdir=None, gpus=8, driver=DRIVER):
    """Environment variables (to lay over os.environ) that make a subprocess use the GPU double.
    workdir: where the fake nvidia-smi and NCCL's rendezvous files go (default: the temp dir).
    driver: the NVIDIA driver's version nvidia-smi reports; one too old for CUDA 13 makes the double's
    CUDA calls fail as CUDA's do (cudaErrorInsufficientDriver).
    Where the double cannot be built (no real CuPy to copy, no gcc or nm) the test is skipped, saying why."""
    try:
        lib, names = build()
    except RuntimeError as exc:
        import pytest
        pytest.skip(str(exc))
    work = os.path.abspath(str(workdir or tempfile.gettempdir()))
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join([SITE, ROOT] + inherited),
            "PATH": fake_smi(work, gpus) + os.pathsep + os.environ.get("PATH", ""),
            "TUTOR_GPU_DOUBLE_LIBNCCL": lib,
            "TUTOR_GPU_DOUBLE_NAMES": names,
            "TUTOR_GPU_DOUBLE_GPUS": str(gpus),
            "TUTOR_GPU_DOUBLE_DRIVER": driver,
            "TUTOR_GPU_DOUBLE_RUNDIR": work}
