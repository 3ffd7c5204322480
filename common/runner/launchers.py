"""Which launcher starts the ranks, known from its own `--version` wherever it comes from (the venv,
MPIEXEC, PATH), and what the runner adds to its line so that a lesson runs and measures the same on
each: MPICH's hydra, Open MPI (ORTE in 4.x, PRRTE in 5.x), Slurm's srun, Intel MPI. A launcher it
does not know runs as given, with one note."""
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from common import mpilib
from common.runner.catalog import ROOT


class LaunchError(RuntimeError):
    """No launcher can be found or started: one line for the learner."""


@dataclass(frozen=True)
class Launcher:
    kind: str      # 'hydra', 'open-mpi', 'srun', 'intel', or '' when unknown
    mpi: str       # the MPI it belongs to, in words: 'MPICH (hydra)', 'Open MPI 5.0.11 (PRRTE)', ...
    version: str   # its --version's first line, cleaned and cut to 100 columns


def python():
    """The ranks' Python: TUTOR_PYTHON (your own environment), else the venv's, else this one."""
    if os.environ.get("TUTOR_PYTHON"):
        return os.environ["TUTOR_PYTHON"]
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return os.path.relpath(venv, ROOT) if os.path.exists(venv) else sys.executable


def found():
    """The launcher as given or found, before the runner adds anything."""
    custom = os.environ.get("MPIEXEC")
    if custom:
        argv = shlex.split(custom)
        if not argv or not shutil.which(argv[0]):
            raise LaunchError(f"MPIEXEC={custom!r}: {argv[0] if argv else 'nothing'} is not a program "
                              "found on PATH")
        return argv
    beside = os.path.join(os.path.dirname(python()), "mpiexec")  # not resolved: a venv's python is a link
    if os.access(os.path.join(ROOT, beside), os.X_OK):
        return [beside]
    on_path = shutil.which("mpiexec")  # your own environment: the MPI your mpi4py was built for
    if not on_path:
        raise LaunchError("mpiexec not found beside the Python or on PATH: run `make setup` (or set MPIEXEC)")
    return [on_path]


def mpiexec(np):
    """The launcher's argv for `np` ranks: $MPIEXEC if set, else the mpiexec beside the ranks' Python (the
    venv's, or TUTOR_PYTHON's), else PATH's; with what its kind needs appended (launchers.additions)."""
    argv = found()
    return argv + additions(identify(argv[0]), argv, np)


def identify(program):
    """The Launcher `program` is (its --version, asked once per process)."""
    return _identify(os.path.join(ROOT, program) if os.sep in program else shutil.which(program) or program)


def flavour(program):
    """The launcher's kind: 'hydra', 'open-mpi', 'srun', 'intel', or '' when `--version` names none."""
    return identify(program).kind


@functools.lru_cache(maxsize=None)
def _identify(program):
    """The Launcher `program --version` says it is ('' kind when it cannot be run or says nothing known)."""
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return Launcher("", "unknown", clean(f"{program} --version failed: {exc}"))
    return identify_text(out.stdout + out.stderr)


def identify_text(text):
    """A Launcher from what `--version` printed."""
    first = clean(next((l for l in text.splitlines() if l.strip()), ""))
    ompi = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+)\.(\d+)\S*", text)
    if "Intel(R) MPI" in text:
        return Launcher("intel", "Intel MPI", first)
    if ompi:
        rte = "ORTE" if int(ompi[1]) < 5 else "PRRTE"
        return Launcher("open-mpi", f"Open MPI {ompi[0].split(') ')[1]} ({rte})", first)
    if "(PRRTE)" in text:
        return Launcher("open-mpi", "Open MPI (PRRTE)", first)
    if "HYDRA" in text:
        version = re.search(r"Version:\s+(\S+)", text)
        return Launcher("hydra", f"MPICH {version[1] if version else ''} (hydra)".replace("  ", " "), first)
    if re.match(r"slurm(-wlm)? \d", first):
        return Launcher("srun", f"Slurm {first.split()[-1]} (srun: the MPI its PMI plugin serves)", first)
    return Launcher("", "unknown", first)


def clean(text, width=100):
    """A library's or launcher's version text as one printable line within `width` columns."""
    line = " ".join(text.replace("\0", " ").split())
    return line if len(line) <= width else line[:width - 1] + "…"


def additions(launcher, argv, np, root=None):
    """The words the runner appends to the launcher's own `argv` for a run of `np` ranks. Nothing the
    learner already gave is given twice or overridden."""
    root = os.geteuid() == 0 if root is None else root
    given = " ".join(argv)
    add = []
    if launcher.kind == "open-mpi":
        if root and "--allow-run-as-root" not in given:
            add.append("--allow-run-as-root")     # Open MPI refuses root without it
        if np > physical_cores() and "oversubscribe" not in given.lower():
            add.append("--oversubscribe")         # past its slots (a core each) it refuses to start
        if "--bind-to" not in given:
            add += ["--bind-to", "none"]          # it pins each rank to a core at -n <= 2
    elif launcher.kind == "srun":
        if "--cpu-bind" not in given and "--cpu_bind" not in given:
            add.append("--cpu-bind=none")
    elif launcher.kind == "intel":
        if "I_MPI_PIN" not in given and "I_MPI_PIN" not in os.environ:
            add += ["-genv", "I_MPI_PIN", "0"]    # Intel MPI pins ranks to cores by default
    return add  # hydra: no binding unless asked; root and -n past the cores are fine


def physical_cores():
    """Cores (not hardware threads) among the CPUs this process may use: Open MPI's slots on a
    machine without a hostfile or a resource manager. Usable CPUs when the topology is unreadable."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f, open(base + "core_id") as g:
                cores.add((f.read().strip(), g.read().strip()))
        except OSError:
            return len(cpus)
    return len(cores) or len(cpus)


def note():
    """The runner's one line about the launcher (unknown to it, or binding ranks), or None."""
    argv = found()
    return note_for(identify(argv[0]), argv)


def note_for(launcher, argv):
    """One line for a launcher the runner does not know or whose binding the learner chose."""
    name = os.path.basename(argv[0])
    if not launcher.kind:
        return f"note: `{name} --version` names no launcher the runner knows: it runs as given"
    given = " ".join(argv)
    if "--bind-to" in given and "--bind-to none" not in given or "--cpu-bind=" in given and \
            "--cpu-bind=none" not in given:
        return "note: your launcher binds ranks to cores: timings of threads and overlap measure that too"
    return None


def words(launcher, program):
    """The launcher in a few words, for a line about it: its MPI, or its name and --version."""
    return launcher.mpi if launcher.kind else f"{os.path.basename(program)} ({launcher.version[:40]})"


def world_env(np):
    """What the ranks need to prove their world (common/world.py): the -n asked, the launcher's MPI."""
    return {"TUTOR_NP": str(np), "TUTOR_LAUNCHER": words(identify(found()[0]), found()[0])}


def mismatch():
    """mismatch_of this Python's mpi4py and the launcher (None when they agree or cannot be
    told, or mpi4py does not load here); mpi4py's MPI is read without initialising it."""
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        library = MPI.Get_library_version()
    except Exception:  # noqa: BLE001 - no verdict is better than a wrong one
        return None
    return mismatch_of(identify(found()[0]), library)


def mismatch_of(launcher, library_text):
    """A line when the launcher belongs to another MPI than the library mpi4py was built for; None when
    they agree or one of them cannot be told (srun and unknown launchers serve whatever PMI says)."""
    family = library_family(library_text)
    kind = {"hydra": "mpich", "open-mpi": "open-mpi"}.get(launcher.kind, "")
    if not family or not kind or family == kind:
        return None
    return (f"MISMATCH: mpi4py is built for {mpilib.parse(library_text).name}, the launcher is "
            f"{launcher.mpi}: build mpi4py for the launcher's MPI, or use that MPI's launcher")


def library_family(text):
    """'mpich', 'open-mpi', 'intel' or '' from MPI.Get_library_version()'s text."""
    return ("intel" if "Intel(R) MPI" in text else "mpich" if "MPICH" in text else
            "open-mpi" if "Open MPI" in text else "")
