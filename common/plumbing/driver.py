"""The NVIDIA driver against the CUDA wheels installed here: CUDA 13's wheels (torch 2.13 from PyPI,
cupy-cuda13x) need driver R580, and many clusters still run R550. Read without a CUDA library:
nvidia-smi for the driver, the installed distributions' names for the CUDA major."""
import re
import shutil
import subprocess

# the oldest Linux driver each CUDA major runs on (NVIDIA's CUDA release notes, minor version
# compatibility): a CUDA 13 wheel needs R580, and many clusters still run R550 (CUDA 12). The majors'
# floors (>= 580, >= 525, >= 450) are NVIDIA's table at
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def version():
    """The NVIDIA driver's version as nvidia-smi says it ('550.54.15'), or None when it cannot tell."""
    smi = shutil.which("nvidia-smi")
    ask = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]  # one line per GPU
    try:
        out = subprocess.run(ask, capture_output=True, text=True, timeout=15).stdout.split() if smi else []
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out and re.fullmatch(r"\d+(\.\d+)+", out[0]) else None


def cuda_wheels():
    """(CUDA major, [distributions]) of the installed wheels built for the newest CUDA major (cupy-cuda13x,
    nvidia-nccl-cu13, cuda-toolkit 13.0.3, torch 2.x+cu130), or None when none names a CUDA major."""
    import importlib.metadata
    found = {}
    for d in importlib.metadata.distributions():
        name, ver = (d.metadata["Name"] or "").lower(), d.version or ""
        m = (re.fullmatch(r"cupy-cuda(\d+)x|nvidia-.+-cu(\d+)", name) or
             re.fullmatch(r"(?:cuda-toolkit|nvidia-cuda-runtime)\s(\d+)\..*", f"{name} {ver}") or
             re.fullmatch(r"torch\s.*\+cu(\d+?)\d", f"{name} {ver}"))
        if m:
            found.setdefault(int(next(g for g in m.groups() if g)), []).append(name)
    major = max((m for m in found if m in DRIVER_FOR_CUDA), default=None)
    return (major, sorted(found[major])) if major else None


def gap(driver, wheels):
    """The line saying that `driver` is too old for `wheels` (cuda_wheels()), or None when it is not
    (or either is unknown): what to do, in one line."""
    if not driver or not wheels:
        return None
    major, names = wheels
    if _parts(driver) >= _parts(DRIVER_FOR_CUDA[major]):
        return None
    fits = max((m for m, need in DRIVER_FOR_CUDA.items() if _parts(driver) >= _parts(need)), default=None)
    way = f", or set TUTOR_PYTHON to a Python with the site's CUDA {fits} torch and CuPy" if fits else ""
    return (f"NVIDIA driver {driver} is older than the {DRIVER_FOR_CUDA[major]} that CUDA {major} "
            f"({names[0]}{', ...' if len(names) > 1 else ''}) needs: update it{way}")


def _parts(text):
    return tuple(int(x) for x in text.split("."))
