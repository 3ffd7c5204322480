"""Bring your own environment: a checkout with no .venv runs on TUTOR_PYTHON and the MPI on PATH, as on a
cluster whose torch, CuPy and mpi4py come from the site. Here the venv's Python plays the site's."""
import os
import shutil
import subprocess
import sys

from conftest import ROOT

BIN = os.path.join(ROOT, ".venv", "bin")


def checkout(tmp_path):
    """The kit's files without .venv, .git or caches: what a fresh clone holds."""
    dest = tmp_path / "kit"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".pytest_cache",
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
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"$ {os.path.join(BIN, 'mpiexec')} ") and f" {os.path.join(BIN, 'python')} " in first
    assert not (kit / ".venv").exists(), "make made a .venv although TUTOR_PYTHON was given"


def test_your_own_python_must_be_a_full_path(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bin", "tutor"), "list"], cwd=ROOT,
                          env=own_env(TUTOR_PYTHON="python3"), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "tutor: TUTOR_PYTHON='python3' is not an executable given by its full path"]
