"""Tier 3: every real lesson under mpiexec with its YAML's check args, every YAML check, a timeout:

  * --api mpi4py on CPU at every NP in the YAML check list (NP is what the lessons' algorithms turn on);
  * the mpi4py GPU path under the GPU double (tests/gpu_double: CuPy and NCCL stood in over MPI) at
    the check NPs up to 3: a world of one or two (where a rank's left and right neighbour are one
    rank) and 3, the first odd NP, with uneven chunks and distinct neighbours;
  * --api torch on CPU at every NP of the check list too: these runs load torch on every rank, so they
    carry the torch mark and run in `make test-torch`; with the mpi4py runs they are the whole grid
    `bin/tutor check` runs (every check NP on every API), which is why CI does not run `make check`
    again after them;
  * the real-GPU cases skip with a reason when there is no GPU.

Runs go through the runner in this process (common/runner/lesson_run.py, as `bin/tutor run` calls it), so
each pays for mpiexec and its ranks, not for starting another runner. Each run's output, and the checks
table `bin/tutor run` would print after it, are held to tests/readable.py: no line over 100 columns,
no check name cut."""
import os

import pytest

from common.plumbing import devices
from common.runner import catalog, checktable, lesson_run, verdict
from conftest import ROOT, TORCH_LESSONS, torch_marks, tutor
from readable import problems as unreadable  # every line <= 100 columns, nothing said N times
from test_runner import assert_whole_names  # the checks table: every name whole, within 100 columns

CASES, GPU_CASES, DOUBLE_CASES, BROKEN = [], [], [], []
SMALL_NP = 3  # the double runs at the check NPs up to this one (the smallest, when none is)
# GUIDE §5: an --api mpi4py CPU run imports neither torch nor CuPy; except where torch is the subject
# (TORCH_LESSONS: the model is a torch model, MPI only moves its gradients)


def small(nps):
    return [n for n in nps if n <= SMALL_NP] or nps[:1]


for lesson in catalog.lessons(os.path.join(ROOT, "lessons")):
    try:
        meta = lesson.meta = catalog.load_yaml(lesson.yaml_path)
    except catalog.CatalogError as exc:
        BROKEN.append(pytest.param(str(exc), id=lesson.name))
        continue
    checks = meta["np"]["check"]
    for api in meta["apis"]:
        GPU_CASES.append(pytest.param(lesson, meta, api, id=f"{lesson.name}-gpu-{api}"))
        for n in checks:
            CASES.append(pytest.param(lesson, meta, n, api, id=f"{lesson.name}-np{n}-{api}",
                                      marks=torch_marks(lesson.name, api)))
    if "mpi4py" in meta["apis"] and "gpu" in meta.get("devices", ["cpu", "gpu"]):
        nps = checks[:1] if lesson.name in TORCH_LESSONS else small(checks)  # 08: a refusal, once
        DOUBLE_CASES += [pytest.param(lesson, meta, n, id=f"{lesson.name}-np{n}",
                                      marks=torch_marks(lesson.name, "mpi4py")) for n in nps]


def run_case(lesson, meta, n, api, device, capfd):
    outcome, checks = lesson_run.run_lesson(lesson, n, api, device, meta.get("args", []))
    said = capfd.readouterr()
    if meta.get("expects_death") and verdict.status(outcome, checks) == "blocked":  # 18's MPI path: ULFM
        pytest.skip(f"{lesson.name} np={n} api={api}: {outcome.blocked}")
    text = said.out + said.err
    tail = "\n".join(text.splitlines()[-40:] + verdict.explain(lesson, outcome, checks))
    where = f"{lesson.name} np={n} api={api} device={device}"
    assert verdict.ok(outcome, checks), f"{where} failed:\n{tail}"
    assert all(c["ok"] for c in checks), tail
    assert outcome.diagnosis is None, f"{where}: a false report from the flight records: {outcome.diagnosis}"
    results = outcome.results
    assert (results["device"], results["transport"]) == (device, devices.TRANSPORT[(api, device)]), tail
    if api == "mpi4py" and device == "cpu":
        loaded = set(results["loaded"])
        allowed = {"torch"} if lesson.name in TORCH_LESSONS else set()
        assert loaded <= allowed, f"an mpi4py CPU run of {lesson.name} imported {sorted(loaded - allowed)}"
    bad = unreadable(text, n)
    assert not bad, f"{where} printed output that is hard to read:\n" + "\n".join(bad[:10])
    assert_whole_names(checktable.checks_table(checks), checks)  # what `bin/tutor run` prints after the run


@pytest.mark.parametrize("lesson, meta, n, api", CASES)
def test_lesson_on_cpu(lesson, meta, n, api, capfd):
    if meta.get("devices") == ["gpu"]:
        pytest.skip("GPU-only lesson")
    run_case(lesson, meta, n, api, "cpu", capfd)


@pytest.mark.gpu
@pytest.mark.parametrize("lesson, meta, api", GPU_CASES)
def test_lesson_on_gpu(lesson, meta, api, capfd):
    ready, why = devices.gpu_ready(api, 2)
    if not ready:
        pytest.skip(f"no GPU path here: {why}")
    run_case(lesson, meta, 2, api, "gpu", capfd)


def cuda_torch():
    """Whether this Python's torch is a CUDA build (its libtorch_cuda is there), without importing it."""
    import importlib.util
    spec = importlib.util.find_spec("torch")
    return bool(spec and spec.submodule_search_locations and any(
        os.path.exists(os.path.join(d, "lib", "libtorch_cuda.so")) for d in spec.submodule_search_locations))


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    from gpu_double import env
    return env(str(tmp_path_factory.mktemp("gpu_double")))


@pytest.mark.parametrize("lesson, meta, n", DOUBLE_CASES)
def test_lesson_on_the_gpu_double(lesson, meta, n, double, monkeypatch, capfd):
    """The CuPy + NCCL path, every YAML check: it proves the calls (signatures read from the installed
    CuPy, syncs, groups, streams), not NCCL itself."""
    if lesson.name in TORCH_LESSONS:  # its model runs on torch's CUDA, not stood in for: blocked (exit 4)
        if cuda_torch():
            pytest.skip("torch here is a CUDA build: libtorch_cuda links NCCL, and the double's stub libnccl "
                        "(loaded first) lacks its symbols, so `import torch` fails, as no learner's run would")
        proc = tutor("run", lesson.name, "-n", str(n), "--device", "gpu", env=double, timeout=120)
        said = proc.stdout + proc.stderr
        assert proc.returncode == 4 and "BLOCKED" in said and "cannot use CUDA" in said, said
        assert "torch GPU stack not usable" not in said and said.count("cannot use CUDA") == 1, said
        return
    for key, value in double.items():
        monkeypatch.setenv(key, value)
    run_case(lesson, meta, n, "mpi4py", "gpu", capfd)


def test_the_small_nps_keep_a_degenerate_world_and_an_odd_one():
    assert small([1, 2, 3, 4, 5]) == [1, 2, 3] and small([2, 3, 4]) == [2, 3] and small([4, 8]) == [4]


def test_every_lesson_has_valid_yaml():
    assert not BROKEN, "\n".join(p.values[0] for p in BROKEN)


@pytest.mark.parametrize("extra, said", [([], "; the race needs -n 2 or more"),
                                         (["--", "--bench"], "; --bench needs -n 2 or more")])
def test_lesson_05_on_one_rank_says_why_there_is_no_race(extra, said):
    """On the GPU node, `run 05 -n 1 -- --bench` (what a one-GPU learner types) printed no race and no
    word why."""
    proc = tutor("run", "05", "-n", "1", "--device", "cpu", *extra, timeout=120)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("no race on one rank")]
    assert proc.returncode == 0 and lines == [
        "no race on one rank: its ring sends nothing and busbw's 2(N-1)/N is 0" + said], proc.stdout


def test_lesson_07_on_one_rank_reads_no_switch_points_from_empty_schedules():
    """On the GPU node at -n 1 it printed 'switch table (fastest measured per size): <= 64K: dbt, else
    ring', a choice among algorithms that each moved nothing."""
    proc = tutor("run", "07", "-n", "1", "--device", "cpu", timeout=120)
    assert proc.returncode == 0 and "switch table" not in proc.stdout, proc.stdout
    assert proc.stdout.count("one rank: every algorithm's schedule is empty") == 1, proc.stdout
