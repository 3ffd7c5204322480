"""What lesson 01 prints: the head-to-head, the eager limit and what sets it, the fixes' table."""
from common import mpilib, report, text


def head_to_head(ctx, count):
    """Section 2's title, and which send each rank is about to make."""
    report.section(ctx, f"2. head-to-head: every rank sends {count * 8} B right first, then receives")
    if ctx.rank != 0:
        return
    print("the send: " + ("dist.send, which is dist.isend(...).wait(); watched with is_completed()"
                          if ctx.api == "torch" else
                          "comm.Ssend, synchronous: it returns once the matching receive has started"),
          flush=True)
    if ctx.transport == "nccl":
        print("nccl: a send waits on the GPU for its receive, so this would hang the stream with no "
              "way back;\nthe demo runs " + ("over a gloo group" if ctx.api == "torch" else
                                              "over MPI on host buffers"), flush=True)


def deadlock(ctx, stuck_all, where, arrived, rescued_all):
    """Where each rank is blocked, whether all are, and whether the way out delivered the data."""
    report.say(ctx, f"blocked in {where}" + ("" if arrived is None else
                    f"\n  the left's message is announced (Iprobe): {arrived}"))
    if ctx.rank == 0:
        print("DEADLOCK DETECTED: no rank can proceed, every send waits for a receive nobody posts"
              if stuck_all else "no deadlock: the sends completed without receivers (buffered)")
        print("way out: each rank posts the receive it never reached; data received intact: "
              + ("yes" if rescued_all else "NO"), flush=True)


def eager_title(ctx):
    where = "a gloo group" if ctx.api == "torch" else "MPI, host buffers"
    report.section(ctx, "3. eager or rendezvous: largest head-to-head plain send that completes alone"
                   + (f"\n   (over {where})" if ctx.transport == "nccl" else ""))


def eager_setting(lib):
    """What sets the measured limit, on the library that ran (common/mpilib names it): lowering each
    one-node setting named here lowered the limit with it."""
    if lib.kind == "mpich":
        return ("on one node MPICH's shared-memory settings, such as MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD: "
                "above it the receiver copies the message out of the sender's memory, so the send waits "
                "for it; between nodes, its network's (UCX_RNDV_THRESH with ch4:ucx)")
    if lib.kind == "openmpi":
        return ("on one node Open MPI's btl_sm_eager_limit, its shared-memory transport's, header included "
                "(`ompi_info --param btl sm --level 4`); between nodes, its network transport's")
    return "each MPI library and transport has its own"


def eager(ctx, limit, first_blocked, tried):
    """The largest send that completed alone, and (MPI) the setting behind it."""
    if ctx.rank != 0:
        return
    lib = "gloo" if ctx.api == "torch" else mpilib.current().name
    if limit == 0:
        print(f"{lib}: even a {first_blocked} B send waited for its receive: no send was buffered")
    else:
        print(f"{lib}: sends up to {limit} B completed with no receive posted;\n  "
              + (f"{first_blocked} B waited for the receiver" if first_blocked else
                 f"every size up to {tried[-1]} B did"))
    if ctx.api == "mpi4py":
        print(text.wrapped(f"that limit is a setting, not a law: {eager_setting(mpilib.current())}. "
                           "The standard lets any Send wait until it is matched, and calls a program "
                           "that needs buffering to finish unsafe", hang=0), flush=True)
    if not ctx.single_node:  # the ring's sends within a node and between nodes take two transports
        print("on several nodes the ring's sends cross two transports, shared memory within a node "
              "and the\nnetwork between nodes, each with limits of its own: the sizes above are where "
              "every\nsend of the ring completed at once", flush=True)


def unbuffered(ctx, ok):
    """Whether the parity fix completed, with intact data, on every rank of the unbuffered communicator."""
    from mpi4py import MPI
    everyone = ctx.comm.allreduce(ok, op=MPI.LAND)
    if ctx.rank == 0:
        print("the parity fix on a communicator that buffers nothing (every Send waits for its "
              "receive):\ncompleted, the left's data intact on every rank: " + ("yes" if everyone else "NO"),
              flush=True)


def fixes(ctx, count, seconds, wrong):
    """The fixes' table (slowest rank's median time), and each fix's time against the fastest's."""
    if ctx.rank != 0:
        return
    rows = [[name, count * 8, count, "float64", round(sec * 1e6, 1),
             float(f"{count * 8 / sec / 1e9:.3g}") if sec > 0 else 0.0, wrong[name]] for name, sec in seconds.items()]
    print(text.table(["fix", "size B", "count", "type", "time us", "algbw GB/s", "#wrong"], rows))
    print("algbw = size B / time: the bytes one rank's message moved per second (GB = 1e9 B)")
    fastest = min(seconds, key=seconds.get)
    print("ratios to the fastest:", ", ".join(f"{k} {v / seconds[fastest]:.2f}x"
                                             for k, v in seconds.items()), flush=True)
    print("(timings are noisy on a shared machine; the data check is what matters)", flush=True)
