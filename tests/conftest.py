"""Shared test helpers: the typer app, a subprocess runner with a timeout, a leftover-process finder.

No test module initialises MPI in the pytest process (mpi4py.rc below): every MPI run is a subprocess
under mpiexec.
"""
import atexit
import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

# A test that imports mpi4py.MPI in the pytest process (a lesson's helper asking the library's name)
# must not start MPI there: a singleton Open MPI 4 sets OMPI_*/PMIX_* in the C environment, and every
# launcher a later test starts inherits them and fails at once, saying nothing (exit 1). MPI calls that
# are valid before MPI_Init (the library's version) still answer.
try:
    import mpi4py
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
except ImportError:
    pass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TUTOR = os.path.join(ROOT, "bin", "tutor")
sys.path.insert(0, ROOT)
# every process this copy of the suite starts carries this in its environment (runners, mpiexec and
# ranks inherit it): processes_running() counts only those, so two suites on one machine never see
# each other's runs. Each pytest-xdist worker makes its own.
SESSION = os.environ["TUTOR_TEST_SESSION"] = f"{os.getpid()}-{os.urandom(6).hex()}"
# progress and the ledger of written files go to a folder of the suite's own, never the learner's .tutor/
if not os.environ.get("TUTOR_STATE"):
    os.environ["TUTOR_STATE"] = tempfile.mkdtemp(prefix="tutor-test-state-")
    atexit.register(shutil.rmtree, os.environ["TUTOR_STATE"], True)


def load_lesson(filename):
    """A lesson file as a module, for its pure functions: lessons import numpy and common at the top
    and start MPI only in main(), so this never initialises MPI."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(filename)[0].split("_", 1)[1],
                                                  os.path.join(ROOT, "lessons", filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_tutor():
    loader = importlib.machinery.SourceFileLoader("tutor_cli", TUTOR)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("tutor_cli", loader))
    loader.exec_module(module)
    return module


# lessons whose every path loads torch in every rank (the model is a torch model; MPI moves its gradients)
TORCH_LESSONS = {"08_data_parallel", "18_fault_tolerance"}


def torch_marks(lesson_name, api):
    """[pytest.mark.torch] for a run that loads torch in every rank: seconds per rank on 2 cores, so
    `make test` leaves them to `make test-torch` (CI runs both)."""
    return [pytest.mark.torch] if api == "torch" or lesson_name in TORCH_LESSONS else []


@pytest.fixture(scope="session")
def app():
    return load_tutor().app


@pytest.fixture
def fixtures_env(monkeypatch):
    monkeypatch.setenv("TUTOR_LESSONS", FIXTURES)


def tutor(*args, env=None, timeout=180):
    """Run bin/tutor in a subprocess (as a learner would) and return the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, TUTOR, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def check_nps(lesson):
    """The NPs `bin/tutor check` runs a lesson at: its YAML's np.check, as common/runner/catalog.py
    reads it from lessons/ (never $TUTOR_LESSONS)."""
    from common.runner import catalog
    return catalog.resolve(lesson, os.path.join(ROOT, "lessons")).meta["np"]["check"]


class Worst(float):
    """The worst budget ratio over a sweep's runs: a float that names the run that gave it when
    printed, so a failing `assert worst <= 1` says which seed to rerun."""
    def __new__(cls, value, where=""):
        worst = super().__new__(cls, value)
        worst.where = where
        return worst

    def __repr__(self):
        return f"{float(self)!r} ({self.where})" if self.where else repr(float(self))


def worst_over_seeds(tmp_path, lesson, n, seeds, worst_of, args=(), api="mpi4py", dtype=None,
                     timeout=300):
    """`bin/tutor run LESSON -n N --api API --json out -- ARGS --seed S --dtype D` for each seed S.
    Every run must pass (the assertion names its seed, shows its output's tail); returns the worst
    of worst_of(results JSON), one run's budget ratios (<= 1 inside), over all the runs, as a Worst.
    dtype None: float32 and float64 in turn, by the seed's parity."""
    worst, where = 0.0, ""
    for seed in seeds:
        kind = dtype or ("float32", "float64")[seed % 2]
        out = tmp_path / f"r{lesson}-{n}-{api}-{seed}-{kind}.json"
        done = tutor("run", lesson, "-n", str(n), "--api", api, "--json", str(out), "--", *args,
                     "--seed", str(seed), "--dtype", kind, timeout=timeout)
        doc = json.loads(out.read_text()) if out.exists() else {}
        said = f"lesson {lesson}, NP {n}, {api}, seed {seed}, {kind}"
        assert done.returncode == 0 and doc.get("status") == "pass", (
            f"{said}: exit {done.returncode}, status {doc.get('status')}\n"
            + done.stdout[-3000:] + done.stderr[-3000:])
        ratio = float(worst_of(doc))
        ratio = math.inf if math.isnan(ratio) else ratio  # NaN: outside any budget
        if ratio > worst or not where:
            worst, where = ratio, said
    return Worst(worst, where)


def dollar_line(output):
    """The printed `$ mpiexec ...` line as one string, its continuations (after a backslash) joined:
    long paths (your own Python, a second venv) wrap it."""
    words = []
    for line in output.splitlines():
        words += line.rstrip("\\").split()
        if not line.endswith("\\"):
            break
    return " ".join(words)


def end_marked(proc, mark):
    """End a test's run: SIGKILL every process carrying TUTOR_TEST_MARK=mark, then `proc`; its output."""
    for pid in processes_running(mark=mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    return proc.communicate()[0]


def processes_running(fragment=None, mark=None):
    """PIDs of live processes (never this test process) started by this copy of the suite (their
    environment carries its TUTOR_TEST_SESSION) whose command line contains `fragment`, or whose
    environment carries TUTOR_TEST_MARK=mark (a run's runner, mpiexec and ranks alike)."""
    session = f"TUTOR_TEST_SESSION={SESSION}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ")
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if session in environ and state != "Z" and (
                    fragment.encode() in cmdline if mark is None else f"TUTOR_TEST_MARK={mark}".encode() in environ):
                found.append(int(entry))
    return found
