"""The lessons' start-up: flags, the MPI world, the device choice, and torch / CuPy-NCCL built on MPI.

    args, ctx = bootstrap.start(__file__, parser)   # every rank
    ctx.comm, ctx.rank, ctx.world_size, ctx.local_rank, ctx.api, ctx.device, ctx.transport
    ctx.gpu                                         # the CUDA device index on a GPU run

MPI is imported only here, after the flags parsed, so a bad flag exits cleanly with one line.
"""
import argparse
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from common import flight
from common.plumbing import devices, network, run_folder, teardown, watchdog, world
from common.text import wrapped

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def env_rank():
    """This process's rank as the launcher set it, before MPI is up (0 when run alone)."""
    for var in RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


REFUSAL_WAIT_S = 3.0  # the most a rank waits for rank 0's one line on bad flags


class LessonParser(argparse.ArgumentParser):
    """argparse that answers bad input with one line, from rank 0 only, and exit status 2."""

    def error(self, message):
        # the other ranks leave only once rank 0 has said why: a rank that exits first makes Open MPI's
        # launcher end the run, and rank 0's line was lost so (1 run in ~700 under load in CI)
        run_dir = run_folder.given()
        said = run_folder.refused(run_dir) if run_dir else None
        if env_rank() == 0:
            print(f"{self.prog}: {message}", file=sys.stderr, flush=True)
            if said:
                with open(said, "w") as f:
                    f.write(message)
        else:
            deadline = time.monotonic() + (REFUSAL_WAIT_S if said else 0.3)
            while time.monotonic() < deadline and not (said and os.path.exists(said)):
                time.sleep(0.02)
        sys.exit(2)


def nonneg_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


def positive(kind, least=None, most=None):
    """A flag type: a finite number > 0 of `kind` (int or float), e.g. type=positive(float); with
    least / most, within those too (a rate of 5e-324 divided by 8 is 0, and the prices divide by it)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
        if (least is not None and value < least) or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"expected a number from {least or 1:g} to {most:g}, got {text}"
                                             if most is not None else f"expected at least {least:g}, got {text}")
        return value
    return parse


def count_list(text):
    """'0,1,7' -> [0, 1, 7]: a flag's comma-separated whole numbers >= 0 (at least one)."""
    counts = [nonneg_int(c) for c in text.split(",") if c.strip()]
    if not counts:
        raise argparse.ArgumentTypeError("expected at least one count, e.g. 0,1,7")
    return counts


def lesson_parser(file, doc):
    """A parser with the flags every lesson shares; the lesson adds its own."""
    p = LessonParser(prog=os.path.basename(file), description=(doc or "").strip().split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", choices=devices.APIS, default="mpi4py", help="mpi4py or torch.distributed")
    p.add_argument("--device", choices=devices.DEVICES, default="auto",
                   help="auto: gpu when every local rank has its own GPU and NCCL loads")
    p.add_argument("--json", metavar="PATH", default=os.environ.get("TUTOR_RESULTS"),
                   help="write the results JSON here (the runner sets this)")
    p.add_argument("--debug-collectives", action="store_true",
                   help="before each collective the ranks compare its fingerprint, and stop at the "
                        "first mismatch instead of hanging (common/plumbing/collcheck.py)")
    p.add_argument("--sanitize", action="store_true", default=os.environ.get("TUTOR_SANITIZE") in ("1", "buffers"),
                   help="non-blocking hazards fail every time, naming the line: sends taken late and "
                        "checksummed, receives poisoned until their wait (common/sanitize.py)")
    return p


@dataclass
class Ctx:
    lesson: str
    comm: object
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    host: str
    api: str
    device: str
    transport: str
    why: str
    json_path: str = None
    params: dict = field(default_factory=dict)
    nccl: object = None       # a cupy.cuda.nccl.NcclCommunicator on (mpi4py, gpu)
    gpu: int = None           # this rank's CUDA device: local_rank % (GPUs this rank can see)
    single_node: bool = True
    store_addr: tuple = None  # (host, port) of the torch TCPStore

    def fail(self, message, code=2, blocked=False):
        """End every rank cleanly with one line from rank 0 (every rank must call this together).
        blocked: what the run needs is missing here (a GPU per rank): the runner's status is `blocked`."""
        from mpi4py import MPI
        if self.rank == 0:
            print(f"{self.lesson}: {message}", file=sys.stderr, flush=True)
            run_dir = run_folder.given()
            if blocked and run_dir:
                with open(run_folder.blocked(run_dir), "w") as f:
                    f.write(message)
        end_torch()  # else torch's NCCL adds "destroy_process_group() was not called" to our one line
        MPI.Finalize()  # after Finalize, mpi4py exits with our code instead of calling MPI_Abort
        sys.exit(code)


def end_torch():
    """Destroy torch's process group if this process made one (collective: every rank, together)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def start(file, parser, argv=None, uses_torch=False, outputs=None):
    """Parse flags, join the MPI world, agree on a device, and set up the chosen API. Collective.
    uses_torch: the lesson computes with torch on the GPU even on --api mpi4py (its probe covers torch).
    outputs: {"--csv": "CSV", "--plot": "PNG", ...}, the lesson's file flags: a path given that cannot
    take a new file (a file the kit did not write, no such folder) is refused in one line, before any work."""
    args = parser.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    world.confirm(comm, MPI)  # -n ranks in one world, or one line and no lesson at all
    watchdog.install(comm.rank)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)  # ranks sharing this node's memory
    hosts = comm.allgather(socket.gethostname())
    ctx = Ctx(lesson=os.path.splitext(os.path.basename(file))[0], comm=comm, rank=comm.rank,
              world_size=comm.size, local_rank=local.rank, local_size=local.size, host=hosts[comm.rank],
              api=args.api, device="cpu", transport="", why="", json_path=args.json,
              single_node=len(set(hosts)) == 1)
    refused = unwritable(args, outputs or {})
    if refused:
        ctx.fail(refused)
    ready, why, seen = choose_gpu(ctx, args, local, uses_torch)
    local.Free()
    missing = [r for r in comm.allgather(None if ready else why) if r is not None]
    all_ready = not missing  # gpu only if every rank has one: one rank on cpu would stall NCCL
    why = why if all_ready else missing[0]
    device, reason, error = devices.decide(args.device, all_ready, why)
    if error:
        ctx.fail(error, blocked=True)
    ctx.device, ctx.why = device, reason
    if args.device == "auto" and device == "cpu" and comm.allreduce(seen, op=MPI.MAX) and ctx.rank == 0:
        print(wrapped(f"note: GPUs were seen, but --device auto runs this on the CPU: {why}"), flush=True)
    ctx.transport = devices.TRANSPORT[(args.api, device)]
    check = None
    if args.debug_collectives:  # collective: every rank duplicates the world for the fingerprints
        from common.plumbing import collcheck
        check = collcheck.Checker(comm)
    flight.install(ctx.rank, gpu=device == "gpu", check=check)  # every call through common/ is recorded
    if args.api == "torch":
        init_torch(ctx)
    elif device == "gpu":
        import cupy
        cupy.cuda.Device(ctx.gpu).use()
        ctx.nccl = nccl_comm(comm)
    if args.sanitize:  # last: the checker's and the world's own set-up calls are not the lesson's
        from common import sanitize
        # TUTOR_SANITIZE=buffers (a practice run): the buffer hazards only, not NCCL's order, which
        # lesson 01's head-to-head exchanges break on purpose
        ctx.comm = sanitize.install(ctx, order=os.environ.get("TUTOR_SANITIZE") != "buffers")
    return args, ctx


def choose_gpu(ctx, args, local, uses_torch):
    """(ready, why, GPUs seen on this node) for this rank; sets ctx.gpu. Collective over `local`.

    One nvidia-smi per node says whether there is any GPU; then each rank probes its own GPU stack on
    GPU local_rank % (GPUs it can see) (its CUDA_VISIBLE_DEVICES or cgroup may show it one GPU alone),
    and the node's ranks compare which physical GPU each would drive: two on one is refused."""
    if args.device == "cpu":
        return False, "asked for --device cpu", 0
    seen, why, gap = local.bcast(devices.node_gpus() if local.rank == 0 else None, root=0)
    ready = gpu_id = None
    if seen:
        ready, why, ctx.gpu, gpu_id = devices.probe(devices.stacks(args.api, uses_torch), local.rank, gap)
    ids = local.allgather(gpu_id if ready else None)
    if ready and None not in ids:
        clash = devices.shared(ids, seen)
        if clash:
            return False, clash, seen
    return bool(ready), why, seen


def store_host(ctx):
    """(where rank 0's TCPStore listens, this rank's interface for gloo, error line or None): loopback
    on one node; across nodes an address every node reaches, found without DNS (common/plumbing/network.py).
    Collective."""
    return network.plan(ctx.comm, ctx.single_node)


def init_torch(ctx):
    """torch.distributed from the MPI ranks: rank 0 opens a store on a free port, MPI tells the rest."""
    import datetime

    import torch.distributed as dist
    addr = None
    host, ifname, error = store_host(ctx)
    if error:
        ctx.fail(error)
    if ifname:  # gloo's pairs (and the gloo subgroups of GPU runs) go over the store's interface
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    if ctx.rank == 0:
        try:  # port 0: the OS picks a free port, so runs side by side never collide
            store = dist.TCPStore(host, 0, ctx.world_size, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=60))
            addr = (host, store.port)
        except Exception as exc:  # tell the other ranks instead of leaving them waiting
            addr = ("error", f"{type(exc).__name__}: {exc}")
    addr = ctx.comm.bcast(addr, root=0)
    if addr[0] == "error":
        raise RuntimeError(f"rank 0 could not open the torch store: {addr[1]}")
    if ctx.rank != 0:
        store = dist.TCPStore(addr[0], addr[1], ctx.world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
    kwargs = {}
    if ctx.device == "gpu":
        import torch
        torch.cuda.set_device(ctx.gpu)
        kwargs["device_id"] = torch.device("cuda", ctx.gpu)
        # eager init makes torch warn, once per rank, that unbatched send/recv are serialized with the
        # group's other ops (the lessons that mean to overlap p2p use batch_isend_irecv). It is C++'s
        # TORCH_WARN_ONCE, past Python's warnings filter: ProcessGroupNCCL reads this variable when the
        # group is made. A learner's own setting stands.
        os.environ.setdefault("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "0")
    teardown.register()  # before the group exists: common/plumbing/teardown.py ends it at exit, in order
    dist.init_process_group("nccl" if ctx.device == "gpu" else "gloo", store=store,
                            rank=ctx.rank, world_size=ctx.world_size, **kwargs)
    ctx.store_addr = addr


def nccl_comm(comm, log=None):
    """A CuPy NCCL communicator over the ranks of MPI communicator `comm` (collective over `comm`).

    Rank 0 makes the unique id (CuPy >= 14: bytes; <= 13: a tuple of ints); MPI broadcasts it;
    every rank then joins with NcclCommunicator(size, id, rank). If rank 0 fails, the failure is
    broadcast instead, so no rank waits forever for an id that will never come.
    """
    from cupy.cuda import nccl
    msg = None
    if comm.rank == 0:
        try:
            msg = ("ok", nccl.get_unique_id())
        except Exception as exc:
            msg = ("error", f"{type(exc).__name__}: {exc}")
    status, uid = comm.bcast(msg, root=0)
    if status == "error":
        raise RuntimeError(f"rank 0 could not create an NCCL unique id: {uid}")
    if log:
        log(f"got the unique id over MPI ({type(uid).__name__}, {len(uid)} items), joining NCCL")
    return nccl.NcclCommunicator(comm.size, uid, comm.rank)


def unwritable(args, outputs):
    """'--csv r.csv: exists and is not a CSV the tutor wrote; left alone' for the first of the file
    flags given whose path cannot take a new file, or None. outputs: {flag: "CSV" or "PNG"}."""
    from common import plot
    from common.plumbing import guard
    for flag, kind in outputs.items():
        path = getattr(args, flag.lstrip("-").replace("-", "_"))
        problem = path and (plot.cannot_write(path) if kind == "PNG" else guard.refusal(path, kind))
        if problem:
            return f"{flag} {problem}"
    return None


def lesson_module(number):
    """Another lesson's file as a module, for the functions it teaches (lesson 10 uses lesson 09's
    collectives). Importing a lesson never starts MPI: a lesson does that only in main()."""
    import glob
    import importlib.util
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lessons")
    found = sorted(glob.glob(os.path.join(folder, f"{number}_*.py")))
    if len(found) != 1:
        raise ImportError(f"no single lesson {number} in {folder}: {found}")
    name = "lesson_" + os.path.basename(found[0])[:-3]
    with _LOADING:  # one loader at a time: a second thread must not get a module still executing
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, found[0])
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]  # a failed load is not a module
                raise
        return sys.modules[name]


_LOADING = threading.RLock()  # re-entrant: lesson 09's module loads lesson 05's while it loads
