"""Lesson 02's mode (d): (a) and (b) again in a second MPICH job with its progress thread on
(MPIR_CVAR_ASYNC_PROGRESS=1), with the same compute; the page runs as that job with --overlap-only."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run(ctx, args, slices, lib, page):
    """Rank 0 launches `page` as the child job; the other ranks wait without spinning. Collective.
    Returns (results, None) or (None, the reason it was not run)."""
    from mpi4py import MPI
    reason, result = None, None
    if ctx.rank == 0:
        launcher = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
        if args.async_progress == "skip":
            reason = "skipped (--async-progress skip)"
        elif lib.kind == "openmpi":
            reason = (f"n/a: {lib.name} has no progress thread for point-to-point to turn on (its TCP "
                      "transport alone, between nodes, can run one: btl_tcp_progress_thread)")
        elif lib.kind != "mpich":
            reason = "n/a: not MPICH, so MPIR_CVAR_ASYNC_PROGRESS does not apply (see your library's own)"
        elif not launcher:
            reason = "no mpiexec beside this python"
        else:
            result, reason = launch(ctx, args, launcher, slices, page)
    done = MPI.COMM_WORLD.Ibarrier()
    while not done.Test():
        time.sleep(0.01)  # leave the cores to the child job
    return ctx.comm.bcast((result, reason), root=0)


def launch(ctx, args, launcher, slices, page):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_", "TUTOR_"))}
    env["MPIR_CVAR_ASYNC_PROGRESS"] = "1"  # a progress thread per rank, started at MPI_Init
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "overlap.json")
        cmd = [launcher, "-n", str(ctx.world_size), sys.executable, "-m", "mpi4py", page,
               "--api", "mpi4py", "--device", "cpu", "--big", str(args.big), "--repeat", str(args.repeat),
               "--overlap-only", out, "--slices", str(slices)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return None, "the async-progress run took over 60 s and was stopped"
        if proc.returncode != 0 or not os.path.exists(out):
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"the async-progress run failed: {last}"
        with open(out) as f:
            return json.load(f), None
