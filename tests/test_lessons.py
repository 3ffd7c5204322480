"""Tier 3: every real lesson under mpiexec, for each NP in its YAML check list and each API, on CPU,
with the YAML's check args and a timeout; every lesson's mpi4py GPU path at each of those NPs under the
GPU double (tests/gpu_double: CuPy and NCCL stood in over MPI); the real-GPU cases skip with a reason
when there is no GPU."""
import json
import os

import pytest

from common import devices
from common.runner import catalog
from conftest import ROOT, tutor

CASES, GPU_CASES, DOUBLE_CASES, BROKEN = [], [], [], []
# GUIDE §5: an --api mpi4py CPU run imports neither torch nor CuPy; except where torch is the subject
TORCH_ON_MPI4PY = {"08_data_parallel": "its model is a torch model; MPI only moves the gradients"}
for lesson in catalog.lessons(os.path.join(ROOT, "lessons")):
    try:
        meta = catalog.load_yaml(lesson.yaml_path)
    except catalog.CatalogError as exc:
        BROKEN.append(pytest.param(str(exc), id=lesson.name))
        continue
    for api in meta["apis"]:
        GPU_CASES.append(pytest.param(lesson, meta, api, id=f"{lesson.name}-gpu-{api}"))
        for n in meta["np"]["check"]:
            CASES.append(pytest.param(lesson, meta, n, api, id=f"{lesson.name}-np{n}-{api}"))
    if "mpi4py" in meta["apis"] and "gpu" in meta.get("devices", ["cpu", "gpu"]):
        nps = meta["np"]["check"][:1] if lesson.name in TORCH_ON_MPI4PY else meta["np"]["check"]  # a refusal
        DOUBLE_CASES += [pytest.param(lesson, meta, n, id=f"{lesson.name}-np{n}") for n in nps]


def run_case(lesson, meta, n, api, device, results, env=None):
    proc = tutor("run", lesson.name, "-n", str(n), "--api", api, "--device", device, "--json", str(results),
                 "--", *map(str, meta.get("args", [])), timeout=meta["timeout_s"] + 60, env=env)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, f"{lesson.name} np={n} api={api} device={device} failed:\n{tail}"
    assert "✗" not in proc.stdout and "PASS" in proc.stdout, tail
    said = json.loads(results.read_text())
    assert (said["device"], said["transport"]) == (device, devices.TRANSPORT[(api, device)]), tail
    if api == "mpi4py" and device == "cpu":
        loaded = set(json.loads(results.read_text())["loaded"])
        allowed = {"torch"} if lesson.name in TORCH_ON_MPI4PY else set()
        assert loaded <= allowed, f"an mpi4py CPU run of {lesson.name} imported {sorted(loaded - allowed)}"


@pytest.mark.parametrize("lesson, meta, n, api", CASES)
def test_lesson_on_cpu(lesson, meta, n, api, tmp_path):
    if meta.get("devices") == ["gpu"]:
        pytest.skip("GPU-only lesson")
    run_case(lesson, meta, n, api, "cpu", tmp_path / "results.json")


@pytest.mark.gpu
@pytest.mark.parametrize("lesson, meta, api", GPU_CASES)
def test_lesson_on_gpu(lesson, meta, api, tmp_path):
    ready, why = devices.gpu_ready(api, 2)
    if not ready:
        pytest.skip(f"no GPU path here: {why}")
    run_case(lesson, meta, 2, api, "gpu", tmp_path / "results.json")


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    from gpu_double import env
    return env(str(tmp_path_factory.mktemp("gpu_double")))


@pytest.mark.parametrize("lesson, meta, n", DOUBLE_CASES)
def test_lesson_on_the_gpu_double(lesson, meta, n, tmp_path, double):
    """The CuPy + NCCL path, every YAML check, at every check NP: it proves the calls (signatures read
    from the installed CuPy, syncs, groups, streams), not NCCL itself."""
    if lesson.name in TORCH_ON_MPI4PY:  # its model runs on torch's CUDA, which the double does not stand in for
        proc = tutor("run", lesson.name, "-n", str(n), "--device", "gpu", env=double, timeout=120)
        assert proc.returncode == 2 and "torch GPU stack not usable" not in proc.stderr and \
            "cannot use CUDA" in proc.stderr, proc.stdout + proc.stderr
        return
    run_case(lesson, meta, n, "mpi4py", "gpu", tmp_path / "results.json", env=double)


def test_every_lesson_has_valid_yaml():
    assert not BROKEN, "\n".join(p.values[0] for p in BROKEN)
