"""Lesson 08 — data parallelism by hand: a training step that equals DDP, gradient buckets, overlap.

The idea: every rank holds the same model and takes its own slice of the global batch. After
backward, each rank's gradient covers only its slice; one all-reduce (SUM) of the gradients makes
every rank's gradient the full-batch one, so every rank takes the same optimizer step and the
replicas never drift apart. torch's DistributedDataParallel (DDP) is built on that all-reduce, and
adds: a broadcast of rank 0's parameters and buffers when it is built (so replicas start equal,
whatever each rank's seed), a broadcast of rank 0's buffers before every forward (BatchNorm's running
statistics; forward_sync_buffers, on by default), and the two engineering tricks this lesson also
builds: gradient buckets and all-reduces launched during backward.

This lesson imports torch on both APIs, because the model is a torch model: `--api` only chooses
who moves the gradients (mpi4py: comm.Allreduce on the tensors' NumPy views, or NCCL through CuPy on
the CUDA tensors' pointers; torch: dist.all_reduce). Each rank runs torch on one thread, so NP ranks
do not fight over the cores with NP thread pools.

What to watch for:
  1. equal to single-process training, and to DDP (checked). A seeded MLP trained K steps three
     ways in the same run: (a) by hand, (b) one process on the whole batch (every rank computes it:
     the model is tiny), (c) torch DDP on the same slices (gloo on CPU). (a) and (b) start from the
     same seed on every rank; (c) starts from weights moved by 0.01*rank, and DDP's broadcast at
     construction puts rank 0's back (shown and checked). Per rank: max |dparam| of a-b, a-c, c-b,
     and the largest difference from rank 0's parameters (must be exactly 0).
     The trap: the default batch (130) is not divisible by 3 or 4, so the shards are uneven and the
     "average of each rank's mean loss" is NOT the full-batch gradient. The exact rule: local loss =
     (sum of my per-sample losses) / B_global, then all-reduce SUM. DDP divides the summed gradients
     by world_size, so under DDP the local loss must be world_size/B * sum. Both facts are shown
     with numbers at step 0.
     Tolerance: float addition is not associative. The single process sums B per-sample terms in its
     matmul's order; here each rank sums its slice, then the all-reduce adds N partial sums in its
     own order. So the gradients differ in the last bits (measured at step 0: ~2e-16 in float64,
     ~7e-8 in float32) and K steps carry that into the parameters (~1e-16, ~4e-8). The checks allow
     1e-10 (float64) and 1e-5 (float32): room for other batches and NPs, yet a wrong average (the
     mean of the per-rank means at NP 3 moves the parameters by ~2e-4 in 3 steps) fails them.
  2. buckets (measured): one all-reduce per parameter tensor vs gradients packed into contiguous
     buckets, one all-reduce per bucket, packed as DDP packs them: last parameter first (backward
     makes the last layer's gradient first), and a bucket closes as soon as it holds --bucket-mb MiB
     or more, so it may pass the cap by one tensor. The lesson reads the buckets DDP itself builds
     for the same model and cap and checks that they are these. DDP's defaults: bucket_cap_mb 25 MiB
     with a first bucket (the gradients ready first) of 1 MiB; and for the first backward it puts
     every gradient in one bucket, then rebuilds the buckets in the order the gradients became
     ready. The deep model here has DEPTH bias-free WIDTH x WIDTH layers, so every tensor has the
     same size S and the bucket count is a closed form: ceil(DEPTH / ceil(cap / S)) (checked). Time
     per step for both (median of --reps, slowest rank, the two taking turns) is printed, not
     checked: fewer calls pay fewer latencies, but a bucket costs two copies (pack, copy back).
  3. overlap (measured, explained): each bucket's all-reduce launched asynchronously from gradient
     hooks (param.register_post_accumulate_grad_hook) as soon as its last gradient is in, while
     backward still runs (torch: dist.all_reduce(..., async_op=True) then work.wait();
     mpi4py: comm.Iallreduce then req.Wait(), with req.Test() from later hooks), vs the all-reduce
     after backward. overlap = (comm + compute - t) / min(comm, compute), as in lesson 02. The
     overlapped gradients must equal the after-backward ones (checked); the times are reported.
     The after-backward row cannot overlap: its figure (ideally 0) is how far measured parts fail
     to add up on this machine, and the hooks hide communication only where they beat it. The
     lesson also counts the buckets already done when backward returned, and says what lets an
     all-reduce run beside backward on the transport and MPI library that ran: MPICH moves a
     non-blocking all-reduce only inside MPI calls made on this thread (the Test() calls of later
     hooks) unless its progress thread is on (MPIR_CVAR_ASYNC_PROGRESS=1, see lesson 02), and Open
     MPI 5, which has no such thread, only inside those calls; other libraries and networks may move
     it between calls. gloo runs it on its own worker threads, which need free cores; NCCL runs its
     kernels on their own CUDA stream beside backward's, which is where DDP's overlap comes from.

Run it:
  make lesson-08 NP=4                         (API=torch; ARGS="--dtype float32 --bucket-mb 0.0625")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/08_data_parallel.py --api mpi4py
"""
import os
import statistics
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, mpilib, report, shards, timing  # noqa: E402

SEED = 8                   # data and models come from this seed, identical on every rank
BATCH = 130                # global batch: 130 % 3 == 1, 130 % 4 == 2, so shards are uneven at NP 3, 4
FEATURES, HIDDEN = 6, 16   # part 1's MLP: FEATURES -> HIDDEN -> tanh -> 1
STEPS = 5                  # optimizer steps in part 1
LR, MOMENTUM = 0.05, 0.9   # SGD with momentum, the same for (a), (b), (c)
TOL = {"float64": 1e-10, "float32": 1e-5}  # max |dparam| allowed (summation order, see above)
DEPTH, WIDTH = 32, 64      # parts 2-3: DEPTH bias-free WIDTH x WIDTH layers, all tensors one size
DEEP_BATCH = 64            # rows per rank in parts 2-3
BUCKET_MB = 0.25           # bucket cap: float64 S = 32 KiB, so 8 layers per bucket, 4 buckets
REPS = 5                   # timed repetitions in parts 2-3 (median reported)
NUDGE = 0.01               # (c) starts from weights moved by NUDGE*rank: DDP's broadcast must undo it
DDP_STEPS = 3              # DDP rebuilds its buckets after the first backward and reports them after 3
WIDTH_COLS = 100           # printed lines wrap here


# ---------------------------------------------------------------- the communication call
def allreduce_sum(ctx, t):
    """t <- the sum of t over all ranks, in place (a contiguous torch tensor)."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    if ctx.api == "torch":
        dist.all_reduce(t, op=dist.ReduceOp.SUM)                       # gloo on cpu, nccl on gpu
    elif ctx.device == "gpu":
        ctx.nccl.allReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_sum(),
                           torch.cuda.current_stream().cuda_stream)    # async: sync before the host reads t
    else:
        ctx.comm.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)        # the numpy view shares t's memory


def allreduce_sum_async(ctx, t, stream=None):
    """Start t <- sum over ranks; returns (wait, test). Do not touch t before wait()."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    if ctx.api == "torch":
        work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
        return work.wait, work.is_completed                             # nccl: wait() orders the streams
    if ctx.device == "gpu":
        stream.wait_stream(torch.cuda.current_stream())                 # t was packed on the compute stream
        ctx.nccl.allReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_sum(), stream.cuda_stream)
        t.record_stream(stream)
        return (lambda: torch.cuda.current_stream().wait_stream(stream)), stream.query
    req = ctx.comm.Iallreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)
    return req.Wait, req.Test


def nccl_type(t):
    from cupy.cuda import nccl
    return {"torch.float32": nccl.NCCL_FLOAT32, "torch.float64": nccl.NCCL_FLOAT64}[str(t.dtype)]


def nccl_sum():
    from cupy.cuda import nccl
    return nccl.NCCL_SUM


# ---------------------------------------------------------------- 1. equal to one process and to DDP
def tiny_mlp(torch, dtype, device):
    torch.manual_seed(SEED)  # same seed on every rank: (a) and (b) start equal without a broadcast
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, 1)).to(dtype=dtype, device=device)


def per_sample_loss(model, x, y):
    return ((model(x) - y) ** 2).sum(dim=1)


def data_parallel_backward(ctx, model, x, y, batch):
    """Every rank ends with the gradient of the FULL batch's mean loss; (x, y) is only my slice."""
    per_sample = per_sample_loss(model, x, y)
    # >>> exercise: grad_average
    (per_sample.sum() / batch).backward()  # my share of the global mean: / B, not / my slice's size
    for p in model.parameters():
        allreduce_sum(ctx, p.grad)         # the shares add up to the full-batch gradient
    # <<< exercise: grad_average


def vs_rank0(ctx, params):
    """Collective: the largest |difference| between this rank's parameters and rank 0's (bitwise: 0)."""
    mine = [p.detach().cpu().numpy() for p in params]
    zero = ctx.comm.bcast(mine if ctx.rank == 0 else None, root=0)
    return max(float(abs(m - z).max()) for m, z in zip(mine, zero))


def max_diff(params_a, params_b):
    return max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(params_a, params_b))


def flat_grads(torch, model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def part1(ctx, args, torch, device):
    """Train (a) by hand, (b) one process, (c) DDP; return this rank's row of numbers."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    n, rank, dtype = ctx.world_size, ctx.rank, getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(args.batch, FEATURES, generator=gen, dtype=torch.float64)
    y = (x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(args.batch, 1, generator=gen,
                                                              dtype=torch.float64))
    x, y = x.to(dtype=dtype, device=device), y.to(dtype=dtype, device=device)
    lo, hi = shards.chunk_bounds(args.batch, n)[rank]
    xr, yr = x[lo:hi], y[lo:hi]  # my slice; may be empty when batch < NP: it then adds zeros

    models = {k: tiny_mlp(torch, dtype, device) for k in "abc"}
    with torch.no_grad():  # (c) starts elsewhere on every rank but 0: DDP must broadcast rank 0's weights
        for p in models["c"].parameters():
            p.add_(NUDGE * rank)
    before = vs_rank0(ctx, models["c"].parameters())
    models["c"] = DDP(models["c"], device_ids=[ctx.gpu] if ctx.device == "gpu" else None)
    after = vs_rank0(ctx, models["c"].module.parameters())
    opts = {k: torch.optim.SGD(m.parameters(), lr=args.lr, momentum=MOMENTUM) for k, m in models.items()}

    # step 0, before training: the two facts about averaging, with numbers
    full = models["b"]
    per_sample_loss(full, x, y).mean().backward()
    g_full = flat_grads(torch, full)
    full.zero_grad()
    mom = models["a"]  # mean of per-rank means: each rank's own mean loss, all-reduced, / N
    per_sample_loss(mom, xr, yr).sum().div(max(hi - lo, 1)).backward()
    for p in mom.parameters():
        allreduce_sum(ctx, p.grad)
        p.grad /= n
    mom_err = float((flat_grads(torch, mom) - g_full).abs().max())
    mom.zero_grad()
    ddp = models["c"]  # DDP with the exact rule's sum / B but no * N: DDP divides by N
    (per_sample_loss(ddp, xr, yr).sum() / args.batch).backward()
    ddp_ratio = float(flat_grads(torch, ddp.module).norm() / g_full.norm())
    ddp.zero_grad()

    exact_err = None
    for step in range(args.steps):
        for opt in opts.values():
            opt.zero_grad()
        data_parallel_backward(ctx, models["a"], xr, yr, args.batch)                       # (a)
        per_sample_loss(models["b"], x, y).mean().backward()                                # (b)
        (per_sample_loss(models["c"], xr, yr).sum() * n / args.batch).backward()           # (c)
        if step == 0:
            exact_err = float((flat_grads(torch, models["a"]) - flat_grads(torch, models["b"])).abs().max())
        for opt in opts.values():
            opt.step()
    if ctx.device == "gpu":
        torch.cuda.synchronize()

    pa, pb, pc = (list(models[k].parameters()) for k in "abc")
    vs0 = vs_rank0(ctx, pa + pc)
    return {"shard": hi - lo, "a_vs_b": max_diff(pa, pb), "a_vs_c": max_diff(pa, pc),
            "c_vs_b": max_diff(pc, pb), "vs_rank0": vs0, "exact_grad_err": exact_err,
            "ddp_init_before": before, "ddp_init_after": after,
            "mom_grad_err": mom_err, "ddp_unscaled_ratio": ddp_ratio}


# ---------------------------------------------------------------- 2. buckets
def pack_buckets(nbytes, cap):
    """Greedy buckets of parameter indices, last parameter first (backward makes its gradient first).
    A bucket closes as soon as it holds `cap` bytes or more, as DDP's do: it may pass the cap by one
    tensor, and a tensor of `cap` bytes or more fills a bucket of its own."""
    buckets, size = [], 0
    # >>> exercise: buckets
    for i in reversed(range(len(nbytes))):
        if not buckets or size >= cap:  # the first bucket, or the last one is full: start a new one
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes[i]
    # <<< exercise: buckets
    return buckets


def ddp_buckets(ctx, torch, device, dtype, cap, x):
    """The buckets DDP itself builds for the deep model and this cap: ([[param index]] it rebuilt after
    the first backward, how many buckets the first backward used); (None, None) if this torch does not
    report them. DDP_STEPS forward/backward passes on every rank (collective)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(deep_mlp(torch, dtype, device), device_ids=[ctx.gpu] if ctx.device == "gpu" else None,
              bucket_cap_mb=cap / 2 ** 20)
    first = None
    for _ in range(DDP_STEPS):
        ddp(x).sum().backward()
        first = first or ddp._get_ddp_logging_data().get("bucket_sizes")
    got = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices")
    if not got or not first:
        return None, None
    return [[int(i) for i in b.split()] for b in got.split(",")], len(str(first).split(","))


def deep_mlp(torch, dtype, device):
    torch.manual_seed(SEED + 1)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.Tanh()]
        torch.nn.init.normal_(layers[-2].weight, std=WIDTH ** -0.5)  # gain 1: grads do not vanish in depth
    return torch.nn.Sequential(*layers).to(dtype=dtype, device=device)


def rel_diff(got, want):
    """max |got - want| over max |want|, over lists of tensors: 0 when equal, ~N*eps for a reordered sum."""
    scale = max(float(w.abs().max()) for w in want)
    return max_diff(got, want) / scale if scale > 0 else max_diff(got, want)


class Bucketer:
    """Flat buffers for the buckets of `params`; all-reduce them after backward or from its hooks."""

    def __init__(self, ctx, torch, params, cap):
        self.ctx, self.torch, self.params = ctx, torch, params
        self.plan = pack_buckets([p.numel() * p.element_size() for p in params], cap)
        self.flat = [torch.empty(sum(params[i].numel() for i in b), dtype=params[0].dtype,
                                 device=params[0].device) for b in self.plan]
        self.home = {id(params[i]): k for k, b in enumerate(self.plan) for i in b}
        self.stream = torch.cuda.Stream() if ctx.device == "gpu" and ctx.api != "torch" else None
        self.armed, self.pending, self.left, self.next, self.done = False, [], [], 0, []
        self.hooks = [p.register_post_accumulate_grad_hook(self.on_grad) for p in params]

    def pack(self, k):
        self.torch.cat([self.params[i].grad.reshape(-1) for i in self.plan[k]], out=self.flat[k])

    def unpack(self, k):
        at = 0
        for i in self.plan[k]:
            g = self.params[i].grad
            g.copy_(self.flat[k][at:at + g.numel()].view_as(g))
            at += g.numel()

    def after_backward(self):
        for k in range(len(self.plan)):
            self.pack(k)
            allreduce_sum(self.ctx, self.flat[k])
            self.unpack(k)

    def arm(self):  # before backward: the hooks will launch each bucket when its last grad is in
        self.armed, self.pending, self.left, self.next = True, [], [len(b) for b in self.plan], 0

    def on_grad(self, p):  # runs inside backward, right after p.grad is final
        if not self.armed:
            return
        for _, test in self.pending:
            test()  # mpi moves a started Iallreduce only inside mpi calls: give it some
        self.left[self.home[id(p)]] -= 1
        # launch in bucket order only: every rank must start its collectives in the same order
        while self.next < len(self.plan) and self.left[self.next] == 0:
            self.pack(self.next)
            self.pending.append(allreduce_sum_async(self.ctx, self.flat[self.next], self.stream))
            self.next += 1

    def finish(self):  # after backward: wait for every bucket, then copy the sums back
        self.done.append(sum(1 for _, test in self.pending if test()))  # already done as backward returned
        for k, (wait, _) in enumerate(self.pending):
            wait()
            self.unpack(k)
        self.armed = False

    def remove(self):
        for h in self.hooks:
            h.remove()


def timed(ctx, modes, reps, sync, reset=lambda: None):
    """{name: median over reps of the slowest rank's seconds} for {name: fn}. The modes take turns
    within each rep (after one warm-up round), so a change in the machine's load hits them all alike;
    reset() runs untimed before each call."""
    from mpi4py import MPI
    times = {name: [] for name in modes}
    for rep in range(reps + 1):
        for name, fn in modes.items():
            reset()
            sync()
            ctx.comm.Barrier()
            t0 = timing.now(sync)
            fn()
            t = ctx.comm.allreduce(timing.now(sync) - t0, op=MPI.MAX)
            if rep:
                times[name].append(t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def parts23(ctx, args, torch, device):
    """Parts 2 and 3 on the deep model: (this rank's checked differences, the counts and times)."""
    n, rank, dtype = ctx.world_size, ctx.rank, getattr(torch, args.dtype)
    sync = timing.syncer(ctx)  # every clock waits for the GPU's queued work
    model = deep_mlp(torch, dtype, device)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(SEED + 2 + rank)  # each rank its own rows
    x, target = (torch.randn(DEEP_BATCH, WIDTH, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
                 for _ in range(2))

    def backward():
        model.zero_grad(set_to_none=False)
        ((model(x) - target) ** 2).sum().div(DEEP_BATCH * n).backward()  # sum / global batch: SUM = the mean

    def per_param():
        for p in params:
            allreduce_sum(ctx, p.grad)

    cap = int(args.bucket_mb * 2 ** 20)
    buckets = Bucketer(ctx, torch, params, cap)
    backward()
    local = [p.grad.clone() for p in params]
    per_param()
    by_param = [p.grad.clone() for p in params]
    for p, g in zip(params, local):
        p.grad.copy_(g)
    buckets.after_backward()
    bucket_err = rel_diff([p.grad for p in params], by_param)
    sync()
    t2 = timed(ctx, {"per_param": per_param, "bucketed": buckets.after_backward}, args.reps, sync,
               reset=lambda: [p.grad.copy_(g) for p, g in zip(params, local)])  # same grads every call

    backward()  # 3. overlap: the after-backward result is the reference
    buckets.after_backward()
    after = [p.grad.clone() for p in params]
    buckets.arm()
    backward()
    buckets.finish()
    sync()
    overlap_err = rel_diff([p.grad for p in params], after)

    def overlapped():
        buckets.arm()
        backward()
        buckets.finish()

    buckets.done = []
    times = timed(ctx, {"compute": backward, "comm": buckets.after_backward,
                        "after": lambda: (backward(), buckets.after_backward()), "overlapped": overlapped},
                  args.reps, sync)
    buckets.remove()
    theirs, first = ddp_buckets(ctx, torch, device, dtype, cap, x)  # DDP's own, for the same model and cap
    sizes = [p.numel() * p.element_size() for p in params]
    return {"bucket_err": bucket_err, "overlap_err": overlap_err}, {
        "calls_per_param": len(params), "calls_bucketed": len(buckets.plan), "buckets": buckets.plan,
        "ddp_buckets": theirs, "ddp_first_backward_buckets": first, "ddp_same_buckets": theirs == buckets.plan,
        "first_bucket_head": buckets.plan[0][0], "bucketed_bytes": sum(sizes[i] for b in buckets.plan for i in b),
        "bucket_bytes": [sum(sizes[i] for i in b) for b in buckets.plan],
        "done_after_backward": [min(buckets.done), max(buckets.done)],
        "time_us_per_param": t2["per_param"] * 1e6, "time_us_bucketed": t2["bucketed"] * 1e6,
        **{f"time_us_{k}": t * 1e6 for k, t in times.items()}}


def wrapped(text):
    return "\n".join(textwrap.fill(part, WIDTH_COLS, break_on_hyphens=False) for part in text.split("\n"))


def where_it_runs(ctx, s):
    """What the overlap figures of part 3 show, and what lets an all-reduce run beside backward on the
    transport that ran (`s`: part 3's summary)."""
    n = ctx.world_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lo, hi = s["done_after_backward"]
    k = s["calls_bucketed"]
    done = f"{lo}" if lo == hi else f"{lo}-{hi}"
    lines = [f"buckets already done when backward returned: {done} of {k} (over the timed runs)"]
    gain = s["overlap_hooks"] - s["overlap_after"]
    if n == 1:
        return lines + ["one rank: an all-reduce has no one to wait for, so there is nothing to hide"]
    if gain > 0.25 and hi > 0:
        lines.append(f"the hooks beat 'backward, then all-reduce' by {gain:+.2f} and buckets finished during "
                     "backward: communication ran during backward here")
    elif gain > 0.25:
        lines.append(f"the hooks beat 'backward, then all-reduce' by {gain:+.2f}, yet no bucket had finished when "
                     "backward returned: this run does not show communication done during backward")
    elif gain < -0.25:
        lines.append(f"the hooks did worse than 'backward, then all-reduce' by {-gain:.2f}: launching from hooks "
                     "cost more here than it hid")
    else:
        lines.append(f"the hooks' figure is within 0.25 of 'backward, then all-reduce' (which cannot overlap): "
                     "no overlap shown beyond this machine's noise")
    if ctx.transport == "mpi":
        lib = mpilib.current()
        progress = lib.kind == "mpich" and os.environ.get("MPIR_CVAR_ASYNC_PROGRESS", "0") not in ("0", "")
        lines.append(f"{lib.name if lib.kind != 'other' else 'MPI'} moves a started Iallreduce "
                     + mpilib.moves_large(lib, progress)
                     + ("" if progress else ": the Test() calls of later hooks, between layers of backward, "
                        "are such calls")
                     + (f"; and {n} ranks share {cores} cores" if n > cores else ""))
    elif ctx.transport == "gloo":
        lines.append(f"gloo runs each all-reduce on its own worker threads, beside backward, when a core is free: "
                     f"{n} ranks, each backward plus a busy gloo thread, on {cores} cores")
    else:
        lines.append("on GPU, NCCL's kernels run on their own CUDA stream and backward's on the compute stream: "
                     "the GPU runs both at once, and the last layers' buckets hide behind the first layers' "
                     "backward, as in DDP")
    return lines


def overlap_of(t, t_comm, t_comp):
    """Share of the shorter part hidden behind the longer: 0 none, 1 all."""
    return (t_comm + t_comp - t) / min(t_comm, t_comp) if min(t_comm, t_comp) > 0 else 0.0


def show_part1(ctx, args, rows):
    """Rank 0 prints part 1: every rank's differences, then the two averaging facts with numbers."""
    if ctx.rank != 0:
        return
    n, d = ctx.world_size, rows[0]
    print(report.table(["rank", "shard", "max|a-b|", "max|a-c|", "max|c-b|", "vs rank 0"],
                       [(r, x["shard"], x["a_vs_b"], x["a_vs_c"], x["c_vs_b"], x["vs_rank0"])
                        for r, x in enumerate(rows)]))
    before, after = max(x["ddp_init_before"] for x in rows), max(x["ddp_init_after"] for x in rows)
    print(f"(c) started from weights moved by {NUDGE}*rank: largest difference from rank 0's {before:.3g} before "
          f"DDP(...),\n  {after:.3g} after: DDP broadcasts rank 0's parameters (and buffers) when it is built")
    print(f"tolerance {TOL[args.dtype]:g} ({args.dtype}): the ranks' partial sums are added in the "
          f"all-reduce's order,\n  not the single process's\n"
          f"step-0 gradient vs the full batch's, max abs difference on rank 0:\n"
          f"  local loss = sum / B, all-reduce SUM (the exact rule):       {d['exact_grad_err']:.3g}\n"
          f"  local loss = my mean, all-reduce, / N (mean of the means):  {d['mom_grad_err']:.3g}"
          f"\n  shards {[x['shard'] for x in rows] if n <= 8 else '...'}: "
          f"{'uneven, so wrong' if args.batch % n else 'equal, so right here'}\n"
          f"DDP divides the summed gradients by N: with local loss sum / B its gradient is "
          f"{d['ddp_unscaled_ratio']:.6g} x\n  the full batch's (1/N = {1 / n:.6g}),\n"
          f"  so (c) uses N / B * sum; with DDP's usual local mean loss you get the mean of the means",
          flush=True)


def show_parts23(ctx, s, errs):
    """Rank 0 prints parts 2 and 3 and adds the overlap figures to the summary `s`."""
    if ctx.rank != 0:
        return
    print(report.table(["all-reduce", "calls/step", "time us", "rel diff"],
                       [("one per tensor", s["calls_per_param"], round(s["time_us_per_param"], 1), "reference"),
                        ("one per bucket", s["calls_bucketed"], round(s["time_us_bucketed"], 1),
                         max(e["bucket_err"] for e in errs))], align=[False, True, True, True]))
    shown = s["bucket_bytes"] if len(s["bucket_bytes"]) <= 8 else f"{s['bucket_bytes'][:8]} ..."
    print(wrapped(f"bucket bytes {shown} (the first starts at tensor {s['first_bucket_head']}, the last "
                  f"layer's); per-tensor / bucketed time = "
                  f"{s['time_us_per_param'] / max(s['time_us_bucketed'], 1e-9):.2f} (bucketed time includes "
                  "packing the grads into the buckets and copying the sums back)"))
    theirs = s["ddp_buckets"]
    if theirs is None:
        print("DDP's own buckets: this torch does not report them (_get_ddp_logging_data)")
    else:
        heads = [f"{b[0]}..{b[-1]}" for b in theirs]
        print(wrapped(f"DDP's own buckets for this model and cap, read from DDP after {DDP_STEPS} steps: its first "
                      f"backward used {s['ddp_first_backward_buckets']} bucket(s), then it rebuilt them in the "
                      f"order the gradients became ready: {len(theirs)} bucket(s), tensors "
                      f"{', '.join(heads[:8])}{' ...' if len(heads) > 8 else ''}: "
                      + ("the same as ours" if s["ddp_same_buckets"] else "NOT the same as ours")))
    tc, tm, ta, th = (s[f"time_us_{k}"] for k in ("compute", "comm", "after", "overlapped"))
    s["overlap_after"], s["overlap_hooks"] = overlap_of(ta, tm, tc), overlap_of(th, tm, tc)
    report.section(ctx, "3. overlap: bucket all-reduces launched from gradient hooks during backward")
    print(report.table(["mode", "time us", "overlap"], [
        ("backward only (compute)", round(tc, 1), ""), ("bucketed all-reduce only (comm)", round(tm, 1), ""),
        ("backward, then all-reduce", round(ta, 1), f"{s['overlap_after']:+.2f}"),
        ("all-reduce from hooks (async)", round(th, 1), f"{s['overlap_hooks']:+.2f}")], align=[False, True, True]))
    worst = max(e["overlap_err"] for e in errs)
    print(f"overlapped grads vs after-backward grads: max|diff| / max|grad| = {worst:.3g}\n"
          f"overlap = (comm + compute - time) / min(comm, compute): 0 none, 1 all hidden; 'backward, then\n"
          f"all-reduce' cannot overlap, so its figure (ideally 0) is how far the parts fail to add up here")
    for line in where_it_runs(ctx, s):
        print(wrapped(line))
    print(end="", flush=True)


def main():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--steps", type=bootstrap.positive(int), default=STEPS,
                        help=f"training steps (default {STEPS})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH, help=f"global batch (default {BATCH})")
    parser.add_argument("--dtype", choices=sorted(TOL), default="float64")
    parser.add_argument("--lr", type=bootstrap.positive(float), default=LR, help=f"SGD learning rate (default {LR})")
    parser.add_argument("--bucket-mb", type=bootstrap.positive(float), default=BUCKET_MB,
                        help=f"bucket cap in MiB (default {BUCKET_MB})")
    parser.add_argument("--reps", type=bootstrap.positive(int), default=REPS,
                        help=f"timed repetitions (default {REPS})")
    args, ctx = bootstrap.start(__file__, parser, uses_torch=True)  # the model is torch on both apis
    import torch  # the model is torch on both apis
    torch.set_num_threads(1)
    n = ctx.world_size
    device = torch.device("cuda", ctx.gpu) if ctx.device == "gpu" else torch.device("cpu")
    if ctx.api != "torch":
        bootstrap.init_torch(ctx)  # ddp needs a torch process group: gloo (nccl on gpu) from the mpi ranks
    itemsize = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    cap = int(args.bucket_mb * 2 ** 20)
    params = {"batch": args.batch, "steps": args.steps, "dtype": args.dtype, "itemsize": itemsize,
              "lr": args.lr, "momentum": MOMENTUM, "tol": TOL[args.dtype], "depth": DEPTH, "width": WIDTH,
              "bucket_mb": args.bucket_mb, "cap_bytes": cap, "reps": args.reps}

    report.section(ctx, f"1. {args.steps} SGD steps (lr {args.lr}, momentum {MOMENTUM}), batch {args.batch} "
                        f"on {n} ranks, {args.dtype}, {ctx.api} ({ctx.transport})")
    if ctx.rank == 0:
        print("(a) by hand  (b) one process, whole batch  (c) DDP", flush=True)
    row = part1(ctx, args, torch, device)
    show_part1(ctx, args, ctx.comm.gather(row, root=0))

    report.section(ctx, f"2. buckets: {DEPTH} tensors of {WIDTH}x{WIDTH} {args.dtype} "
                        f"({WIDTH * WIDTH * itemsize} B each), cap {cap} B")
    if ctx.rank == 0:
        print(f"time per step: median of {args.reps}, slowest rank", flush=True)
    values, summary = parts23(ctx, args, torch, device)
    show_parts23(ctx, summary, ctx.comm.gather(values, root=0))
    params["ddp_buckets_read"] = int(summary["ddp_buckets"] is not None)  # an older torch may not say
    if ctx.api != "torch":
        import torch.distributed as dist
        dist.destroy_process_group()  # we built it for DDP; report.finish tears down only torch's own
    report.finish(ctx, {**row, **values}, summary=summary, params=params)


if __name__ == "__main__":
    main()
