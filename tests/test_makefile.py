"""The Makefile's own rules: what `make setup` and `make clean` may remove (only a venv that make setup
made, which its mark says), what a Python given as TUTOR_PYTHON must prove, and which targets a
damaged .mpi or an empty VENV= may stop.

Every test runs make in a folder of its own that holds a copy of the Makefile and requirements*.txt, so
nothing here touches the checkout's .venv, caches or results. No real venv is made: PYTHON= names a
stand-in whose `-m venv DIR` makes a venv of stand-ins, whose `-m pip` writes what it was asked into a
log (pip.log in the venv) and never reaches the network; `-c` runs the tests' own Python."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

MARK = ".made-by-tutor"
KIT_FILES = ("Makefile", "requirements.txt", "requirements-gpu.txt", "requirements-openmpi.txt")

# a venv's bin/python: -c is the tests' Python; pip is pretend (has-NAME files say what is installed)
VENV_PYTHON = f"""#!/bin/sh
venv=$(dirname "$0")/..
case "$(cd "$venv" && pwd -P)" in "$TUTOR_TEST_REAL"/?*) ;; *) echo "$0: not below $TUTOR_TEST_HOME" >&2; exit 3;; esac
if [ "$1" = -m ] && [ "$2" = ensurepip ]; then touch "$venv/has-pip"; exit 0; fi
if [ "$1" = -m ] && [ "$2" = pip ]; then
  [ -e "$venv/has-pip" ] || {{ echo "$0: No module named pip" >&2; exit 1; }}
  case "$3" in
    show) shift 4; for name in "$@"; do [ -e "$venv/has-$name" ] && exit 0; done; exit 1;;
    install) shift 2; echo "$*" >> "$venv/pip.log"; exit 0;;
    *) exit 0;;
  esac
fi
exec {sys.executable} "$@"
"""

# the system Python: `-m venv DIR` makes DIR a venv of the stand-in above, pip included. DIR must lie in
# the test's own folder (an empty VENV= once became "/" here: /bin/python, /pyvenv.cfg)
SYSTEM_PYTHON = """#!/bin/sh
[ "$1" = -m ] && [ "$2" = venv ] || exit 3
case "$3" in /*) dir=$3;; ?*) dir=$(pwd -P)/$3;; *) dir=;; esac
case "$dir" in *..*) dir=;; "$TUTOR_TEST_HOME"/?*|"$TUTOR_TEST_REAL"/?*) ;; *) dir=;; esac
[ -n "$dir" ] || { echo "stand-in python: '$3' is not below $TUTOR_TEST_HOME" >&2; exit 3; }
mkdir -p "$3/bin" && cp "$(dirname "$0")/venv-python" "$3/bin/python" && touch "$3/pyvenv.cfg" "$3/has-pip"
"""


def script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def kit(tmp_path):
    """A folder with the Makefile and the requirements files, and the stand-in Pythons beside it."""
    dest = tmp_path / "kit"
    dest.mkdir()
    for name in KIT_FILES:
        shutil.copy(os.path.join(ROOT, name), dest / name)
    tools = tmp_path / "tools"
    tools.mkdir()
    script(tools / "venv-python", VENV_PYTHON)
    script(tools / "python", SYSTEM_PYTHON)
    return dest


def clean_env(home):
    """A learner's shell: none of the variables an outer `make test MPI=... VENV=...` exports; the
    stand-ins write only below `home`."""
    drop = ("MPIEXEC", "TUTOR_PYTHON", "TUTOR_ANY_PYTHON", "VIRTUAL_ENV", "TUTOR_RUNNING_IN", "MPI", "VENV",
            "PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("MAKE", "MFLAGS"))}
    # no nvidia-smi of this machine's, no pip of its own
    return {**env, "PATH": "/usr/bin:/bin", "TUTOR_TEST_HOME": str(home), "TUTOR_TEST_REAL": os.path.realpath(home)}


def make(kit, *args, env=None):
    proc = subprocess.run(["make", "--no-print-directory", f"PYTHON={kit.parent / 'tools' / 'python'}", *args],
                          cwd=kit, env={**clean_env(kit.parent), **(env or {})}, capture_output=True, text=True,
                          timeout=120)
    proc.text = proc.stdout + proc.stderr
    return proc


def fake_venv(kit, path, *has, mark=False, stamps=False, python=True):
    """A venv as `python -m venv` leaves it, holding the packages named in `has` ("pip", "mpich", ...);
    python=False: its bin/python links to an interpreter that is gone."""
    (path / "bin").mkdir(parents=True)
    (path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    if python:
        shutil.copy(kit.parent / "tools" / "venv-python", path / "bin" / "python")
    else:
        (path / "bin" / "python").symlink_to(kit.parent / "gone" / "python3")
    for name in has:
        (path / f"has-{name}").touch()
    if mark:
        (path / MARK).write_text("made by make setup\n")
    if stamps:  # what the Makefile before the mark wrote at the end of a setup
        (path / ".mpi").write_text("mpich\n")
        (path / ".installed-mpich").touch()
        os.utime(path / ".installed-mpich", (1, 1))  # older than requirements.txt: pip runs again
    return path


def tree(path):
    """Every file below path with its bytes: what must not change."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(path.rglob("*"))}


# ---- H1: make setup / lesson-NN / clean remove only a venv that make setup made ----------------------

def refused_in_one_line(proc, folder):
    ours = [line for line in proc.text.splitlines() if not line.startswith("make: ***")]
    assert proc.returncode != 0 and len(ours) == 1 and "not made by make setup" in ours[0], proc.text
    assert str(folder) in ours[0], proc.text
    return ours[0]


@pytest.mark.parametrize("target", ["setup", "lesson-00"])
def test_a_folder_that_is_not_a_venv_is_refused_and_kept(kit, target):
    """Seen: `make setup VENV=scratch` removed a scratch folder and the file in it."""
    scratch = kit.parent / "scratch"
    scratch.mkdir()
    (scratch / "notes.txt").write_text("mine\n")
    before = tree(scratch)
    proc = make(kit, target, f"VENV={scratch}")
    refused_in_one_line(proc, scratch)
    assert tree(scratch) == before


@pytest.mark.parametrize("older", [False, True], ids=["yours", "an older setup's"])
@pytest.mark.parametrize("case", ["cupy12", "other MPI", "Python gone"])
def test_a_venv_make_setup_did_not_make_is_never_removed(kit, case, older):
    """A working venv holding cupy-cuda12x, or the other MPI's wheel, or whose Python is gone, was
    removed. One of yours is left as it is; one an older make setup installed into (.installed-*, no
    mark) too, with the reason and the command that renews it."""
    venv = kit.parent / "venvs" / "work"
    fake_venv(kit, venv, "pip", *{"cupy12": ["cupy-cuda12x"], "other MPI": ["mpich"]}.get(case, []),
              python=case != "Python gone", stamps=older)
    (venv / "my-project.txt").write_text("mine\n")
    before = tree(venv)
    proc = make(kit, "setup", f"VENV={venv}", *(["MPI=openmpi"] if case == "other MPI" else []))
    line = refused_in_one_line(proc, venv)
    assert tree(venv) == before
    if older:
        reason = {"cupy12": "has the CUDA 12 CuPy/NCCL", "other MPI": "holds mpich, not openmpi",
                  "Python gone": "'s Python does not run"}[case]
        assert line == f"setup: {venv}{'' if case == 'Python gone' else ' '}{reason}; not made by make setup, " \
                       f"so kept (rm -rf {venv} renews it)", line
    else:
        assert line == f"setup: {venv} is a venv not made by make setup (no .made-by-tutor): left as it is; " \
                       f"to run on it: TUTOR_PYTHON={venv}/bin/python", line


def test_a_venv_make_setup_made_is_made_anew_with_its_mark(kit):
    venv = fake_venv(kit, kit / ".venv", "pip", "cupy-cuda12x", mark=True)
    proc = make(kit, "setup")
    assert proc.returncode == 0, proc.text
    assert "setup: .venv holds the CUDA 12 CuPy/NCCL this kit no longer uses: making .venv anew" in proc.stdout
    assert not (venv / "has-cupy-cuda12x").exists() and (venv / MARK).exists()
    assert (venv / ".installed-mpich").exists() and "-r requirements.txt" in (venv / "pip.log").read_text()


def test_a_new_venv_gets_the_mark(kit):
    venv = kit.parent / "new" / "v"
    proc = make(kit, "setup", f"VENV={venv}")
    assert proc.returncode == 0, proc.text
    assert (venv / MARK).exists() and (venv / ".installed-mpich").exists(), proc.text


def test_a_venv_an_older_make_setup_made_is_still_installed_into(kit):
    """CI's .venv from before the mark (.mpi, .installed-mpich): requirements changed, pip runs again."""
    venv = fake_venv(kit, kit / ".venv-old", "pip", "mpich", stamps=True)
    proc = make(kit, "setup", f"VENV={venv}")
    assert proc.returncode == 0, proc.text
    assert "-r requirements.txt" in (venv / "pip.log").read_text() and not (venv / MARK).exists()


def test_make_clean_removes_only_a_venv_make_setup_made(kit):
    mine = fake_venv(kit, kit / ".venv", "pip", mark=True)
    proc = make(kit, "clean")
    assert proc.returncode == 0 and not mine.exists(), proc.text
    yours = fake_venv(kit, kit.parent / "yours", "pip", stamps=True)
    before = tree(yours)
    proc = make(kit, "clean", f"VENV={yours}")
    assert proc.returncode != 0 and tree(yours) == before, proc.text
    assert proc.stderr.splitlines()[0] == f"clean: {yours} was not made by make setup (no {MARK}): left as it " \
                                          "is", proc.stderr


# ---- M3: a venv whose making was cut short (no pip) --------------------------------------------------

def test_a_venv_cut_short_before_pip_is_made_anew(kit):
    """Ctrl-C during `python -m venv`: every later make setup failed "No module named pip"."""
    venv = fake_venv(kit, kit / ".venv", mark=True)  # the mark is written before `python -m venv` runs
    proc = make(kit, "setup")
    assert proc.returncode == 0, proc.text
    assert "setup: .venv has no pip (its making was cut short): making .venv anew" in proc.stdout
    assert (venv / ".installed-mpich").exists() and (venv / "has-pip").exists()


def test_a_venv_of_yours_without_pip_gets_it_from_ensurepip(kit):
    venv = fake_venv(kit, kit / ".venv")  # python -m venv --without-pip .venv, in the kit's place
    proc = make(kit, "setup")
    assert proc.returncode == 0 and "setup: .venv has no pip: adding it" in proc.stdout, proc.text
    assert (venv / ".installed-mpich").exists() and not (venv / MARK).exists()


def test_the_mark_is_written_before_the_venv_is_made(kit):
    plan = make(kit, "-n", "setup")
    made = [line for line in plan.stdout.splitlines() if "-m venv .venv" in line]
    assert len(made) == 1 and made[0].index(f"> .venv/{MARK}") < made[0].index("-m venv .venv"), plan.stdout


# ---- M1: TUTOR_PYTHON must be a Python, proved by what it prints ------------------------------------

@pytest.mark.parametrize("target", ["check", "test", "own-python"])
def test_a_program_that_is_not_python_does_not_pass(kit, target):
    proc = make(kit, target, env={"TUTOR_PYTHON": "/bin/true"})
    assert proc.returncode != 0, proc.text
    assert proc.stderr.splitlines()[0] == "setup: TUTOR_PYTHON=/bin/true is no Python with mpi4py, numpy, typer, " \
                                          "pyyaml (it printed nothing): pip install them there", proc.text


def test_your_own_python_with_the_kits_needs_passes(kit):
    proc = make(kit, "-s", "own-python", env={"TUTOR_PYTHON": sys.executable})
    assert proc.returncode == 0 and proc.text == "", proc.text


# ---- L8, L9 and an empty VENV= ----------------------------------------------------------------------

def test_make_clean_keeps_your_progress_and_says_what_it_removes(kit):
    (kit / ".tutor").mkdir()
    (kit / ".tutor" / "progress.json").write_text("{}")
    (kit / "results").mkdir()
    proc = make(kit, "clean")
    assert proc.returncode == 0 and (kit / ".tutor" / "progress.json").exists(), proc.text
    assert not (kit / "results").exists()
    helped = make(kit, "-s", "help").stdout
    assert "(progress) stays" in helped and "clean-progress" in helped, helped
    assert make(kit, "clean-progress").returncode == 0 and not (kit / ".tutor").exists()


def test_a_damaged_mpi_file_stops_no_target(kit):
    """`make help` and `make clean` failed with "MPI=bogus: choose mpich or openmpi" (never typed)."""
    (kit / ".venv").mkdir()
    (kit / ".venv" / ".mpi").write_text("bogus\n")
    for args in (["help"], ["-n", "clean"], ["-n", "setup"]):
        proc = make(kit, *args)
        assert proc.returncode == 0 and "choose" not in proc.text, (args, proc.text)
    typed = make(kit, "-n", "setup", "MPI=bogus")
    assert typed.returncode != 0 and "MPI=bogus: choose mpich or openmpi" in typed.stderr


@pytest.mark.parametrize("venv", ["", "a b"])
def test_an_empty_venv_is_one_clear_line(kit, venv):
    """`make setup VENV=` printed "setup: 's Python does not run ... making  anew" and ran venv with no folder."""
    proc = make(kit, "setup", f"VENV={venv}")
    assert proc.returncode != 0 and len(proc.text.strip().splitlines()) == 1, proc.text
    assert f"VENV='{venv}': name one folder for the venv" in proc.stderr, proc.text


@pytest.mark.parametrize("case", ["cupy12", "other MPI", "Python gone", "not a venv"])
def test_refusals_for_the_kits_own_venv_fit_100_columns(kit, case):
    """A .venv made before the mark (or by hand) in the kit's place: the line says what to run."""
    if case == "not a venv":
        (kit / ".venv").mkdir()
        (kit / ".venv" / "notes.txt").write_text("mine\n")
    else:
        fake_venv(kit, kit / ".venv", "pip", *{"cupy12": ["cupy-cuda12x"], "other MPI": ["mpich"]}.get(case, []),
                  python=case != "Python gone", stamps=True)
    proc = make(kit, "setup", *(["MPI=openmpi"] if case == "other MPI" else []))
    line = refused_in_one_line(proc, ".venv")
    assert len(line) <= 100, (len(line), line)
    if case == "not a venv":
        assert line == "setup: .venv is there, not made by make setup (no .made-by-tutor): left as it is; " \
                       "move it away", line
    assert (kit / ".venv").exists()
