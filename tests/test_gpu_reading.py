"""What a reading of torch 2.13 and CuPy 14.2 found on the GPU path, held without a GPU (issue 25):
torch's implicit device, a driver too old for the CUDA wheels, MIG slices on the torch path, torch's
C++ P2P warning, and a failed run that leaves torch's process group behind.

torch's side is reached by telling torch things about CUDA (tests/gpu_double/accelerator, a
sitecustomize for the ranks; monkeypatched torch in this process); the mpi4py side by the GPU double."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from common.runner import catalog, lesson_run, mpi_launchers, verdict
from conftest import ROOT

ACCELERATOR = os.path.join(ROOT, "tests", "gpu_double", "accelerator")
PYTHON = sys.executable  # the tests' Python (the venv's, or TUTOR_PYTHON's), whose launcher the runner finds


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
    outcome, checks = lesson_run.run_lesson(ten, 2, "torch", "cpu", ten.meta.get("args", []))
    said = capfd.readouterr()
    tail = "\n".join((said.out + said.err).splitlines()[-30:])
    assert verdict.ok(outcome, checks) and checks and all(c["ok"] for c in checks), tail


# ---- 3. torch's C++ warning about unbatched P2P ops ----------------------------------------------

P2P_WARNING = "TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING"


class OneRank:
    """ctx.comm for a world of one: bcast hands back what it was given."""
    rank, size = 0, 1

    def bcast(self, value, root=0):
        return value


def nccl_start(monkeypatch):
    """bootstrap.init_torch on a GPU run, torch's CUDA and NCCL stood in: the environment torch's
    ProcessGroupNCCL would read when the group is made."""
    import torch
    import torch.distributed as dist

    from common import bootstrap

    class Store:
        port = 12345

        def __init__(self, *args, **kwargs):
            pass
    seen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: None)
    monkeypatch.setattr(dist, "TCPStore", Store)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: seen.update(backend=backend, value=os.environ.get(P2P_WARNING)))
    ctx = bootstrap.Ctx(lesson="x", comm=OneRank(), rank=0, world_size=1, local_rank=0, local_size=1,
                        host="h", api="torch", device="gpu", transport="nccl", why="", gpu=0)
    bootstrap.init_torch(ctx)
    return seen


@pytest.mark.torch
def test_the_p2p_serialization_warning_is_off_before_the_nccl_group_starts(monkeypatch):
    """TORCH_WARN_ONCE in C++ passes Python's warnings filter: only the variable silences it."""
    monkeypatch.setenv(P2P_WARNING, "")
    monkeypatch.delenv(P2P_WARNING)  # registered, so the value init_torch sets is undone after the test
    assert nccl_start(monkeypatch) == {"backend": "nccl", "value": "0"}


@pytest.mark.torch
def test_a_learner_who_wants_the_p2p_warning_keeps_it(monkeypatch):
    monkeypatch.setenv(P2P_WARNING, "1")
    assert nccl_start(monkeypatch)["value"] == "1"


# ---- 5. a failed run ends torch's process group ------------------------------------------------

FAIL_AFTER_TORCH = """
import atexit, sys
from common import bootstrap
parser = bootstrap.lesson_parser("x.py", "")
args, ctx = bootstrap.start("x.py", parser, ["--api", "torch", "--device", "cpu"])
import torch.distributed as dist
atexit.register(lambda: print("group left at exit:", dist.is_initialized(), flush=True))
ctx.fail("stop here")
"""


@pytest.mark.torch
def test_ctx_fail_destroys_the_process_group_torch_started():
    """On NCCL a group never destroyed adds torch's own warning after the kit's one line."""
    said = subprocess.run([PYTHON, "-c", FAIL_AFTER_TORCH], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert said.returncode == 2 and said.stderr.strip() == "x: stop here", said.stdout + said.stderr
    assert said.stdout.strip().splitlines()[-1] == "group left at exit: False", said.stdout


# ---- 4. MIG slices on the torch path -----------------------------------------------------------

def mig_torch(monkeypatch):
    """A torch that sees one MIG slice per process (CUDA_VISIBLE_DEVICES=MIG-<uuid>): the slice's own
    UUID, and the PCI address of the GPU it is cut from, as CUDA reports both. NumPy does the math."""
    import types

    import numpy as np

    def props(gpu):
        return types.SimpleNamespace(uuid=os.environ["CUDA_VISIBLE_DEVICES"], pci_domain_id=0,
                                     pci_bus_id=0x3B, pci_device_id=0)
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                 get_device_properties=props)
    dist = types.ModuleType("torch.distributed")
    dist.is_nccl_available = lambda: True
    torch = types.ModuleType("torch")
    torch.__version__, torch.cuda, torch.distributed, torch.float32 = "2.13.0", cuda, dist, np.float32
    torch.arange = lambda n, dtype, device: np.arange(n, dtype=dtype)
    torch.ones = lambda *shape, device: np.ones(shape, dtype=np.float32)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


def test_two_ranks_on_slices_of_one_gpu_get_the_kits_refusal_on_torch(monkeypatch):
    from common.plumbing import devices
    mig_torch(monkeypatch)
    ids = []
    for uuid in ("MIG-5c1f8e2a-0000-0000-0000-000000000001", "MIG-5c1f8e2a-0000-0000-0000-000000000002"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
        ok, why, gpu, gpu_id = devices.probe(devices.stacks("torch"), 0)
        assert ok and gpu == 0, why
        ids.append(gpu_id)
    assert ids == ["0000:3B:00.0"] * 2
    assert devices.shared(ids, 1).startswith("2 ranks on this node but 1 GPU(s): ranks 0 and 1 would share")


# ---- 2. a driver older than the CUDA wheels need -----------------------------------------------

@pytest.mark.parametrize("found, wheels, said", [
    ("550.54.15", (13, ["cupy-cuda13x"]), "NVIDIA driver 550.54.15 is older than the 580.65.06 that CUDA 13 "
     "(cupy-cuda13x) needs: update it, or set TUTOR_PYTHON to a Python with the site's CUDA 12 torch and "
     "CuPy"),
    ("470.256.02", (13, ["cuda-toolkit", "cupy-cuda13x"]), "NVIDIA driver 470.256.02 is older than the "
     "580.65.06 that CUDA 13 (cuda-toolkit, ...) needs: update it, or set TUTOR_PYTHON to a Python with the "
     "site's CUDA 11 torch and CuPy"),
    ("418.87", (12, ["nvidia-nccl-cu12"]), "NVIDIA driver 418.87 is older than the 525.60.13 that CUDA 12 "
     "(nvidia-nccl-cu12) needs: update it"),
    ("580.65.06", (13, ["cupy-cuda13x"]), None),
    ("575.51.03", (12, ["cupy-cuda12x"]), None),
    (None, (13, ["cupy-cuda13x"]), None),
    ("550.54.15", None, None),
])
def test_the_driver_gap_names_the_minimum_and_the_way_out(found, wheels, said):
    from common.plumbing import driver
    assert driver.gap(found, wheels) == said


@pytest.mark.parametrize("installed, want", [
    ([("torch", "2.13.0"), ("cuda-toolkit", "13.0.3"), ("nvidia-nccl-cu13", "2.29.7"), ("numpy", "2.4.6")],
     (13, ["cuda-toolkit", "nvidia-nccl-cu13"])),
    ([("torch", "2.5.1+cu121"), ("cupy-cuda12x", "13.3.0")], (12, ["cupy-cuda12x", "torch"])),
    ([("torch", "2.7.0+cu118")], (11, ["torch"])),
    ([("torch", "2.13.0+cpu"), ("numpy", "2.4.6")], None),
])
def test_the_cuda_major_is_read_from_the_installed_wheels(monkeypatch, installed, want):
    import importlib.metadata
    import types

    from common.plumbing import driver
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [
        types.SimpleNamespace(metadata={"Name": name}, version=version) for name, version in installed])
    assert driver.cuda_wheels() == want


def hello_on_old_driver(tmp_path, device):
    from gpu_double import env
    hello = [*mpi_launchers.mpiexec(2), "-n", "2", PYTHON, "-m", "mpi4py", "lessons/00_hello.py", "--device", device]
    return subprocess.run(hello, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, **env(tmp_path, driver="550.54.15")})


def old_driver_row():
    """What the kit says of R550 against the CUDA wheels this Python holds: their names differ by machine
    (CI's venv: cupy-cuda13x alone; a GPU node's image adds cuda-toolkit and torch+cu130), the rest not."""
    from common.plumbing import driver
    row = driver.gap("550.54.15", driver.cuda_wheels()) or ""
    assert re.fullmatch(r"NVIDIA driver 550\.54\.15 is older than the 580\.65\.06 that CUDA 13 \([a-z0-9, .-]+\) "
                        r"needs: update it, or set TUTOR_PYTHON to a Python with the site's CUDA 12 torch and CuPy",
                        row), row
    return row


def test_device_gpu_on_an_old_driver_is_refused_in_one_line_that_says_what_to_do(tmp_path):
    """The double's CUDA fails as CUDA's does (cudaErrorInsufficientDriver); the kit says why and what
    to do instead of passing CUDA's error on."""
    proc = hello_on_old_driver(tmp_path, "gpu")
    said = proc.stderr.split("-" * 20)[0].strip().splitlines()  # Open MPI's banner follows, between rules
    assert proc.returncode == 2 and said == [f"00_hello: --device gpu: no usable GPU: {old_driver_row()}"], \
        proc.stderr


def test_auto_on_an_old_driver_says_so_once_and_runs_on_the_cpu(tmp_path):
    proc = hello_on_old_driver(tmp_path, "auto")
    assert proc.returncode == 0 and "device cpu" in proc.stdout, proc.stdout + proc.stderr
    notes = proc.stdout.split("\n[")[0]  # the note comes first, wrapped under itself
    words = " ".join(notes.split())
    assert words.startswith("note: GPUs were seen, but --device auto runs this on the CPU: NVIDIA driver "
                            "550.54.15 is older than the 580.65.06") and "TUTOR_PYTHON" in words, proc.stdout
    assert proc.stdout.count("note: GPUs were seen") == 1 and "cudaError" not in proc.stdout + proc.stderr


def test_doctor_shows_the_driver_and_the_minimum_the_wheels_need(tmp_path):
    """The whole doctor on an R550 node: the driver's row says what to do, the choices point at it."""
    from gpu_double import env
    proc = subprocess.run([PYTHON, os.path.join(ROOT, "bin", "tutor"), "doctor"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **env(tmp_path, driver="550.54.15")})
    rows = [" ".join(r.split()) for r in re.split(r"\n(?:  )?(?=\S)", proc.stdout)]  # rows, wrapped under
    # themselves, and section titles
    assert old_driver_row() in rows, proc.stdout
    apis = [r for r in rows if r.startswith("--api")]
    assert apis[0] == "--api mpi4py cpu: the NVIDIA driver is too old (above)", proc.stdout
    # the double stands in for CuPy and nvidia-smi, not torch: on a real GPU node (its own nvidia-smi)
    # a CUDA torch really runs, as CUDA's forward compatibility can make an old driver do
    real_node = shutil.which("nvidia-smi") is not None
    assert len(apis) == 2 and (apis[1].startswith("--api torch gpu: ") if real_node else
                               apis[1] == "--api torch cpu: the NVIDIA driver is too old (above)"), proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert max(len(x) for x in proc.stdout.splitlines()) <= 100


@pytest.mark.parametrize("gpus, found, row", [
    (8, "580.95.05", "580.95.05; CUDA 13 (cupy-cuda13x) needs 580.65.06 or newer"),
    (0, None, "none here; CUDA 13 (cupy-cuda13x) needs 580.65.06 or newer"),
])
def test_doctor_shows_a_new_enough_driver_beside_the_minimum(monkeypatch, capsys, gpus, found, row):
    from common.plumbing import driver
    from common.runner import doctor
    monkeypatch.setattr(driver, "version", lambda: found)
    monkeypatch.setattr(driver, "cuda_wheels", lambda: (13, ["cupy-cuda13x"]))
    assert doctor.driver_section(gpus) is None
    assert capsys.readouterr().out.split() == ["NVIDIA", "driver", *row.split()]


# ---- 6. lesson 02's mode (d), said for the transport that ran ----------------------------------

@pytest.mark.parametrize("api, device, transport, said", [
    ("torch", "gpu", "nccl", "n/a: an MPI progress thread does not drive NCCL's kernels"),
    ("mpi4py", "gpu", "nccl", "n/a: an MPI progress thread does not drive NCCL's kernels"),
    ("torch", "cpu", "gloo", "n/a: an MPI progress thread is for MPI; gloo moves p2p on its own threads"),
    ("mpi4py", "cpu", "mpi", None),
])
def test_lesson_02_says_why_d_did_not_run_for_the_transport_that_ran(api, device, transport, said):
    import types

    from conftest import load_lesson
    two = load_lesson("02_isend_irecv.py")
    assert two.d_not_here(types.SimpleNamespace(api=api, device=device, transport=transport)) == said


# ---- 7. lesson 03 builds its p2p backend outside the clock -------------------------------------

COUNT_BACKENDS = """
import atexit, runpy, sys
from common import p2p
made, real = [], p2p.backend
p2p.backend = lambda ctx: made.append(1) or real(ctx)
atexit.register(lambda: print(f"backends made: {len(made)}", flush=True))  # one write, never split
sys.argv = ["lessons/03_broadcast_scatter.py", "--reps", "3"]
runpy.run_path("lessons/03_broadcast_scatter.py", run_name="__main__")
"""


def test_lesson_03_times_its_repetitions_on_one_backend_made_before_the_clock():
    """torch + NCCL's backend runs an all-reduce when it is made: made per repetition, that ran inside
    the timed region. One backend per way (bcast+slice, scatter), however many repetitions."""
    proc = subprocess.run([*mpi_launchers.mpiexec(2), "-n", "2", PYTHON, "-c", COUNT_BACKENDS], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # each rank prints once; two ranks' lines may interleave on one line of the launcher's output
    assert re.findall(r"backends made: (\d+)", proc.stdout) == ["2", "2"], proc.stdout


# ---- 8. lesson 07's alpha on NCCL --------------------------------------------------------------

@pytest.mark.parametrize("transport", ["mpi", "gloo"])
def test_lesson_07_says_nothing_of_group_launches_off_nccl(transport):
    import types

    from lessons.allreduce_algorithms import show
    assert show.alpha_note(types.SimpleNamespace(transport=transport)) is None


def test_lesson_07_says_what_its_alpha_holds_on_nccl(tmp_path):
    """Under the GPU double (mpi4py + NCCL): the note prints once, right under the line reading alpha."""
    from gpu_double import env
    run = [PYTHON, os.path.join(ROOT, "bin", "tutor"), "run", "07", "-n", "2", "--device", "gpu"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, **env(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    words = " ".join(proc.stdout.split())
    note = ("on NCCL each round trip timed here is two group launches from the host (the ping's send, the "
            "pong's receive) and a device sync before rank 0 reads its clock: alpha, half a round trip, "
            "holds one launch and half a sync besides NCCL's own latency")
    assert words.count(note) == 1 and words.index("alpha = least half RTT") < words.index(note), proc.stdout


def test_the_torch_probe_on_an_old_driver_is_quiet_and_says_what_to_do(monkeypatch, recwarn):
    """A CUDA torch on an R550 driver: is_available() warns (once per rank) and answers False."""
    import types
    import warnings

    from common.plumbing import devices

    def too_old():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 12040)")
        return False
    torch = types.ModuleType("torch")
    torch.__version__, torch.cuda = "2.13.0", types.SimpleNamespace(is_available=too_old)
    torch.distributed = types.ModuleType("torch.distributed")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
    gap = "NVIDIA driver 550.54.15 is older than the 580.65.06 that CUDA 13 (torch) needs: update it"
    assert devices.probe(("torch",), 0, gap)[:2] == (False, gap) and not recwarn.list
    assert devices.probe(("torch",), 0)[1].startswith("torch 2.13.0 cannot use CUDA") and recwarn.list
