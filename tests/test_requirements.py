"""One CUDA stack: the pins in requirements*.txt, together with what the pinned torch pulls in, never
fight over a library file or a CUDA major version.

Two wheels fight when they ship the same library under one name (nvidia-nccl-cu12 and nvidia-nccl-cu13
both write nvidia/nccl/lib/libnccl.so.2: pip reports nothing, the last one wins, and uninstalling either
deletes the file), and a CuPy built for CUDA 12 next to a torch built for CUDA 13 loads libraries that
nothing installs.
"""
import os
import re

import pytest

from conftest import ROOT

# What PyPI's Linux x86_64 wheel of each pinned torch requires, read with
# `pip install --dry-run --no-deps --report r.json --platform manylinux_2_28_x86_64 torch==2.13.0`.
# A CUDA build of torch installed here is read from its own metadata instead (see torch_requires).
TORCH_PYPI_REQUIRES = {
    "2.13.0": ["cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]"
               "==13.0.3", "nvidia-cudnn-cu13==9.20.0.48", "nvidia-cusparselt-cu13==0.8.1",
               "nvidia-nccl-cu13==2.29.7", "nvidia-nvshmem-cu13==3.4.5"],
}
LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(?:\[[^\]]*\])?\s*(?:==\s*(?P<version>[^\s;#]+))?")


def pins(text):
    """[(name, version or None)] of a requirements text, comments and markers dropped."""
    found = []
    for raw in text.splitlines():
        m = LINE.match(raw.split("#", 1)[0].strip())
        if m:
            found.append((m["name"].lower().replace("_", "-"), m["version"]))
    return found


def cuda_major(name, version):
    """The CUDA major a distribution is built for (None when it names none)."""
    m = re.fullmatch(r"cupy-cuda(\d+)x", name) or re.fullmatch(r"nvidia-.+-cu(\d+)", name)
    if m:
        return int(m[1])
    if name == "cuda-toolkit" and version:
        return int(version.split(".")[0])
    return None


def library(name):
    """The library a distribution ships, without its CUDA suffix: nvidia-nccl-cu12 -> nvidia-nccl."""
    return re.sub(r"-cu\d+$", "", re.sub(r"^cupy-cuda\d+x$", "cupy", name))


def problems(sets):
    """Every fight among {source: [(name, version)]}: a library pinned twice, or two CUDA majors."""
    found, owners, majors = [], {}, {}
    for source, reqs in sets.items():
        for name, version in reqs:
            other = owners.setdefault(library(name), (name, version, source))
            if (other[0], other[1]) != (name, version):
                found.append(f"{library(name)}: {other[0]}=={other[1]} ({other[2]}) and {name}=={version} "
                             f"({source}) would install the same files")
            if cuda_major(name, version) is not None:
                majors.setdefault(cuda_major(name, version), f"{name} ({source})")
    if len(majors) > 1:
        found.append("CUDA majors disagree: " + ", ".join(f"{m}: {who}" for m, who in sorted(majors.items())))
    return found


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return pins(f.read())


def torch_requires(version):
    """The installed torch's CUDA requirements when it is a CUDA build, else PyPI's, from the table."""
    import importlib.metadata
    dist = importlib.metadata.distribution("torch")
    own = [r for r in dist.requires or [] if r.startswith(("nvidia-", "cuda-"))]
    if dist.version.split("+")[0] == version and own:
        return pins("\n".join(own))
    if version not in TORCH_PYPI_REQUIRES:
        pytest.fail(f"torch {version} is pinned: add what its PyPI wheel requires to TORCH_PYPI_REQUIRES")
    return pins("\n".join(TORCH_PYPI_REQUIRES[version]))


def test_requirements_make_one_cuda_stack():
    kit, gpu = read("requirements.txt"), read("requirements-gpu.txt")
    torch_version = dict(kit)["torch"]
    sets = {"requirements.txt": kit, "requirements-gpu.txt": gpu,
            f"torch {torch_version}": torch_requires(torch_version)}
    assert not problems(sets), "\n".join(problems(sets))
    assert any(name.startswith("cupy-cuda") for name, _ in kit), "no CuPy pinned for the GPU path"


def test_the_check_catches_the_stacks_it_was_written_for():
    """The requirements before this test existed: CuPy for CUDA 12 and a second NCCL wheel."""
    old = {"requirements.txt": pins("torch==2.13.0\ncupy-cuda12x==14.2.0"),
           "requirements-gpu.txt": pins("nvidia-nccl-cu12==2.32.3"),
           "torch 2.13.0": pins("\n".join(TORCH_PYPI_REQUIRES["2.13.0"]))}
    found = problems(old)
    assert any(f.startswith("nvidia-nccl: nvidia-nccl-cu12==2.32.3") or "nvidia-nccl-cu13" in f
               for f in found), found
    assert any(f.startswith("CUDA majors disagree") for f in found), found


def test_pins_reads_extras_markers_and_comments():
    assert pins('cupy-cuda13x[ctk]==14.2.0; sys_platform == "linux"  # why\n# only a comment\ntyper') == [
        ("cupy-cuda13x", "14.2.0"), ("typer", None)]
    assert cuda_major("cupy-cuda13x", "14.2.0") == 13 and cuda_major("nvidia-nccl-cu12", "2") == 12
    assert cuda_major("cuda-toolkit", "13.0.3") == 13 and cuda_major("numpy", "2.4.6") is None
