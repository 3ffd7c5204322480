"""What a reading of torch 2.13 and CuPy 14.2 found on the GPU path, held without a GPU (issue 25):
torch's implicit device, a driver too old for the CUDA wheels, MIG slices on the torch path, torch's
C++ P2P warning, and a failed run that leaves torch's process group behind.

torch's side is reached by telling torch things about CUDA (tests/gpu_double/accelerator, a
sitecustomize for the ranks; monkeypatched torch in this process); the mpi4py side by the GPU double."""
import os
import subprocess
import sys

import pytest

from common.runner import catalog, engine
from conftest import ROOT

ACCELERATOR = os.path.join(ROOT, "tests", "gpu_double", "accelerator")
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
PYTHON = PYTHON if os.path.exists(PYTHON) else sys.executable


def lesson(number):
    found = next(x for x in catalog.lessons(os.path.join(ROOT, "lessons")) if x.id == number)
    found.meta = catalog.load_yaml(found.yaml_path)
    return found


# ---- 1. torch's implicit device ----------------------------------------------------------------

@pytest.mark.torch
def test_the_stand_in_tells_torch_its_accelerator_is_cuda():
    """Else the test below would pass for want of a lie."""
    said = subprocess.run([PYTHON, "-c", "import torch; print(torch._C._get_accelerator().type, "
                           "torch.accelerator.current_accelerator().type)"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ACCELERATOR})
    assert said.stdout.split() == ["cuda", "cuda"], said.stdout + said.stderr


@pytest.mark.torch
def test_lesson_10_keeps_fsdp_on_the_cpu_when_torch_says_it_has_cuda(monkeypatch, capfd):
    """A CUDA torch on a GPU node, a run on the CPU (make check's default, or auto at NP > GPUs):
    fully_shard without mesh= built its mesh on cuda and moved the parameters there."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ACCELERATOR, ROOT]))
    ten = lesson("10")
    outcome, checks = engine.run_lesson(ten, 2, "torch", "cpu", ten.meta.get("args", []))
    said = capfd.readouterr()
    tail = "\n".join((said.out + said.err).splitlines()[-30:])
    assert engine.ok(outcome, checks) and checks and all(c["ok"] for c in checks), tail
