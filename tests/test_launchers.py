"""The launcher, wherever it comes from: known by its own --version, given what it needs (and only
that), shown on the `$` line; and no run on the wrong world: a launcher that starts singletons, or one
of another MPI, is refused in one line and never passes."""
import json
import os
import subprocess
import sys

import pytest

from common import mpilib
from common.runner import mpi_launchers, supervise
from conftest import FIXTURES, ROOT, dollar_line, tutor

VERSIONS = {
    "hydra": ("HYDRA build details:\n    Version:                                 5.0.2\n", "MPICH 5.0.2 (hydra)"),
    "orte": ("mpiexec (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
             "Open MPI 4.1.4 (ORTE)"),
    "mpirun4": ("mpirun (Open MPI) 4.1.6\n", "Open MPI 4.1.6 (ORTE)"),
    "prrte": ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
              "Open MPI 5.0.11 (PRRTE)"),
    "srun": ("slurm 23.11.4\n", "Slurm 23.11.4 (srun: the MPI its PMI plugin serves)"),
    "intel": ("Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
              "Copyright 2003-2023, Intel Corporation.\n", "Intel MPI"),
    "unknown": ("singletons 1.0\n", "unknown"),
}
KIND = {"hydra": "hydra", "orte": "open-mpi", "mpirun4": "open-mpi", "prrte": "open-mpi", "srun": "srun",
        "intel": "intel", "unknown": ""}


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_each_launcher_is_known_by_its_version(name):
    text, mpi = VERSIONS[name]
    found = mpi_launchers.identify_text(text)
    assert (found.kind, found.mpi) == (KIND[name], mpi)
    assert "\0" not in found.version and len(found.version) <= 100


def flags(name, argv=("mpiexec",), np=2, root=True, cores=2, monkeypatch=None):
    monkeypatch.setattr(mpi_launchers, "physical_cores", lambda: cores)
    return mpi_launchers.additions(mpi_launchers.identify_text(VERSIONS[name][0]), list(argv), np, root=root)


@pytest.mark.parametrize("name", ["orte", "prrte"])
def test_open_mpi_as_root_past_its_cores_gets_what_it_needs(name, monkeypatch):
    one_node = ["--mca", "btl", "^ofi,uct"]
    assert flags(name, np=3, monkeypatch=monkeypatch) == [
        "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", *one_node]
    assert flags(name, np=2, root=False, monkeypatch=monkeypatch) == ["--bind-to", "none", *one_node]


@pytest.mark.parametrize("argv, env", [
    (["mpirun", "--host", "a:2,b:2"], {}), (["mpirun", "--hostfile=nodes"], {}), (["mpirun", "-H", "a,b"], {}),
    (["mpirun"], {"PRTE_MCA_prte_default_hostfile": "nodes"}), (["mpirun", "--mca", "btl", "self,tcp"], {}),
    (["mpirun"], {"OMPI_MCA_btl": "self,sm,tcp"})])
def test_open_mpi_on_several_nodes_or_with_its_own_btl_keeps_every_transport(argv, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert "^ofi,uct" not in flags("prrte", argv, monkeypatch=monkeypatch)


def test_open_mpi_in_a_slurm_allocation_keeps_every_transport(monkeypatch):
    held = mpi_launchers.allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4",
                                 "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert held.nodes == 2
    ompi = mpi_launchers.identify_text(VERSIONS["prrte"][0])
    assert "btl" not in mpi_launchers.additions(ompi, ["mpirun"], 4, root=False, held=held)


def test_what_the_learner_gave_is_neither_repeated_nor_overridden(monkeypatch):
    argv = ["mpirun", "--map-by", ":OVERSUBSCRIBE", "--bind-to", "core", "--allow-run-as-root"]
    assert flags("prrte", argv, np=8, monkeypatch=monkeypatch) == ["--mca", "btl", "^ofi,uct"]  # nothing given
    assert "binds ranks to cores" in mpi_launchers.note_for(mpi_launchers.identify_text(VERSIONS["prrte"][0]), argv)


@pytest.mark.parametrize("name, added", [
    ("hydra", []), ("srun", ["--cpu-bind=none"]), ("intel", ["-genv", "I_MPI_PIN", "0"]), ("unknown", [])])
def test_other_launchers(name, added, monkeypatch):
    monkeypatch.delenv("I_MPI_PIN", raising=False)
    assert flags(name, np=64, monkeypatch=monkeypatch) == added
    said = mpi_launchers.note_for(mpi_launchers.identify_text(VERSIONS[name][0]), ["x"])
    assert (said is not None) == (name == "unknown"), said


def fake_launcher(folder, version, name="mpirun"):
    """A launcher that says `version` and otherwise drops the Open MPI flags and runs the venv's
    real launcher (found as the runner would find it without MPIEXEC)."""
    real = os.path.join(ROOT, mpi_launchers.found()[0]) if not os.environ.get("MPIEXEC") else None
    if real is None or mpi_launchers.flavour(real) != "hydra":
        pytest.skip("needs hydra (MPICH) as the launcher the runner finds, to stand behind the fake")
    path = folder / name
    path.write_text("#!/bin/sh\n"
                    f'if [ "$1" = --version ]; then printf "{version}"; exit 0; fi\n'
                    'skip=0; for a; do shift; case "$a" in --allow-run-as-root|--oversubscribe) ;; '
                    '--bind-to) skip=1 ;; --mca) skip=2 ;; '
                    '*) if [ $skip -gt 0 ]; then skip=$((skip - 1)); else set -- "$@" "$a"; fi ;; esac; done\n'
                    f'exec {real} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("where", ["MPIEXEC", "PATH"])
def test_the_dollar_line_shows_what_was_added_wherever_the_launcher_comes_from(where, tmp_path):
    fake = fake_launcher(tmp_path, "mpiexec (OpenRTE) 4.1.4\\n", name="mpiexec")
    env = {"TUTOR_LESSONS": FIXTURES}
    if where == "MPIEXEC":
        env["MPIEXEC"] = str(fake)
    else:  # your own Python, with no mpiexec beside it: the launcher comes from PATH
        bindir = tmp_path / "site"
        bindir.mkdir()
        (bindir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (bindir / "python").chmod(0o755)
        env.update(PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}", TUTOR_PYTHON=str(bindir / "python"))
    proc = tutor("run", "1", "-n", "3", env=env)
    first = dollar_line(proc.stdout).split()
    assert proc.returncode == 0 and first[:2] == ["$", str(fake)], proc.stdout + proc.stderr
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    over = ["--oversubscribe"] if 3 > mpi_launchers.physical_cores() else []  # Open MPI's slots: a core each
    one_node = ["--mca", "btl", "'^ofi,uct'"]  # quoted for the shell, as shown
    assert first[2:2 + len(root) + len(over) + 6] == [*root, *over, "--bind-to", "none", *one_node, "-n"], first


def singletons(folder):
    """A launcher that starts N singletons: the command N times, none with any MPI variable."""
    path = folder / "singletons"
    path.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "singletons 1.0"; exit 0; fi\n'
                    'n=$2; shift 2; i=0\n'
                    'while [ $i -lt $n ]; do env -u PMI_SIZE -u PMI_RANK "$@" & i=$((i+1)); done\n'
                    'wait; exit 0\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("lesson, api", [
    ("00", "mpi4py"), ("05", "mpi4py"), ("00", "torch"), ("05", "torch")])
def test_singletons_are_refused_never_a_pass(lesson, api, tmp_path):
    out = tmp_path / "out.json"
    proc = tutor("run", lesson, "-n", "2", "--api", api, "--device", "cpu", "--json", str(out),
                 env={"MPIEXEC": singletons(tmp_path)}, timeout=120)
    said = [l for l in proc.stderr.splitlines() if "wrong world" in l]
    assert proc.returncode != 0 and "PASS" not in proc.stdout, proc.stdout + proc.stderr
    assert len(said) == 1 and "1 rank(s) of the 2 started" in said[0], proc.stderr
    assert "mpi4py's MPI is " in proc.stderr and "singletons 1.0" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "crash" and doc["ok"] is False and doc["checks"] == [], doc


def test_by_hand_each_process_of_a_wrong_world_says_so_itself(tmp_path):
    """mpiexec of another MPI by hand: its size variable is set, the world is of one."""
    script = tmp_path / "lesson.py"
    script.write_text(f"import sys; sys.path.insert(0, {ROOT!r})\n"
                      "from common import bootstrap\n"
                      "args, ctx = bootstrap.start(__file__, bootstrap.lesson_parser(__file__, ''))\n"
                      "print('taught', ctx.world_size)\n")
    proc = subprocess.run([sys.executable, "-m", "mpi4py", str(script)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OMPI_COMM_WORLD_SIZE": "2"})
    assert proc.returncode == 3 and "taught" not in proc.stdout, proc.stdout + proc.stderr
    assert "wrong world: 1 rank(s) of the 2 started (OMPI_COMM_WORLD_SIZE)" in proc.stderr
    assert "the launcher is Open MPI's" in proc.stderr


@pytest.mark.parametrize("text, short", [
    ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25\n", "MPICH 5.0.2"),
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\0",
     "Open MPI 4.1.4"),
])
def test_library_names_are_clean_and_short(text, short):
    assert mpilib.parse(text).name == short


@pytest.mark.parametrize("launcher, library, mismatch", [
    ("prrte", "MPICH Version: 5.0.2", True), ("hydra", "Open MPI v5.0.11, package", True),
    ("hydra", "MPICH Version: 5.0.2", False), ("orte", "Open MPI v4.1.4, package", False),
    ("srun", "MPICH Version: 5.0.2", False), ("unknown", "Open MPI v5.0.11", False)])
def test_mismatch_is_said_only_when_both_are_known_and_differ(launcher, library, mismatch):
    said = mpi_launchers.mismatch_of(mpi_launchers.identify_text(VERSIONS[launcher][0]), library)
    assert (said is not None) == mismatch, said
    assert said is None or said.startswith("MISMATCH: mpi4py is built for ")


def doctor_mpi(launcher):
    """doctor's mpi section (in a subprocess: no MPI library is loaded into pytest) with MPIEXEC set."""
    proc = tutor("doctor", env={"MPIEXEC": str(launcher)}, timeout=120)
    lines = proc.stdout.splitlines()
    mpi = lines[lines.index("mpi") + 1:lines.index("torch")]
    assert "Traceback" not in proc.stdout + proc.stderr and all(len(l) <= 100 for l in lines), proc.stdout
    return proc.returncode, " ".join(" ".join(mpi).split())


def test_doctor_says_a_singleton_launcher_is_not_one_world(tmp_path):
    rc, said = doctor_mpi(singletons(tmp_path))
    assert rc == 1 and "NO: 2 processes, each in a world of 1" in said, said


def test_doctor_says_what_a_failed_launch_said(tmp_path):
    bad = tmp_path / "mpirun"
    bad.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi\n'
                   'echo "mpirun has detected an attempt to run as root." >&2; exit 1\n')
    bad.chmod(0o755)
    rc, said = doctor_mpi(bad)
    assert rc == 1 and "ValueError" not in said, said
    assert "exited 1: mpirun has detected an attempt to run as root" in said, said
    assert "launcher Open MPI 4.1.4 (ORTE)" in said, said


def test_nul_bytes_and_an_unended_last_line_never_lead_the_runners_own_lines(capsys):
    """Open MPI's launcher leaves a NUL at the end of its crash report: it showed as '\\x00CRASH ...'."""
    import io
    out = supervise.Outcome(rc=0, seconds=0.0)
    supervise._pump(io.BytesIO(b"Open MPI v5.0.11\x00\nrank 1 failed\n\x00"), out, echo=True)
    shown = capsys.readouterr().out
    assert "\x00" not in shown and shown.endswith("\n") and out.tail == ["Open MPI v5.0.11", "rank 1 failed"]
    supervise._pump(io.BytesIO(b"last words"), out, echo=True)
    assert capsys.readouterr().out == "last words\n"


def test_a_session_folder_a_killed_launcher_left_never_stops_a_later_run(tmp_path):
    """Open MPI 5 keeps its session in $TMPDIR/ompi.<launcher pid>, and a launcher killed by the
    watchdog leaves it behind; a later launcher that got the same pid failed to start (CI: "The PMIx
    server's listener thread failed to start", exit 213). Each run has a temp folder of its own, inside
    its run folder: stale sessions in the learner's TMPDIR for the next pids change nothing."""
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last = int(f.read())
    host = os.uname().nodename
    for pid in range(last + 1, last + 400):  # made here, in this process: no pid is used up doing it
        stale = tmp_path / f"ompi.{pid}"
        stale.mkdir()
        for name in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}", f"pmix.{host}.tool.prterun-{host}-{pid}@0"):
            (stale / name).write_text("left by a killed run\n")
    # one write a rank (print's pieces are writes of their own: two ranks' split and interleaved once)
    probe = ("import os; t, r = os.environ['TMPDIR'], os.environ['TUTOR_RUN_DIR']; "
             "os.write(1, f'tmp-in-run-folder {t.startswith(r + os.sep) and os.path.isdir(t)}\\n'.encode())")
    cmd = [*mpi_launchers.mpiexec(2), "-n", "2", mpi_launchers.python(), "-c", probe]
    out = supervise.supervise(cmd, timeout=60, echo=False, env={"TMPDIR": str(tmp_path)})
    said = "\n".join(out.tail)
    assert out.rc == 0 and said.count("tmp-in-run-folder True") == 2, said
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"ompi.{p}" for p in range(last + 1, last + 400))
