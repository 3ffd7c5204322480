"""Lesson 08 — data parallelism by hand: a training step that equals DDP, gradient buckets, overlap.

The idea: every rank holds the same model and takes its own slice of the global batch. After
backward, each rank's gradient covers only its slice; one all-reduce (SUM) of the gradients makes
every rank's gradient the full-batch one, so every rank takes the same optimizer step and the
replicas never drift apart. torch's DistributedDataParallel (DDP) is built on that all-reduce, plus a
broadcast of rank 0's parameters when it is built, and the two tricks this lesson also builds:
gradient buckets and all-reduces launched during backward. The model is torch on both APIs; `--api`
chooses who moves the gradients (mpi4py: comm.Allreduce, or NCCL through CuPy; torch: dist.all_reduce).

What to watch for:
  1. equal to one process and to DDP (checked): a seeded MLP trained K steps (a) by hand, (b) in one
     process on the whole batch, (c) by DDP on the same slices. The trap: batch 130 is uneven over 3
     or 4 ranks, so "the average of each rank's mean loss" is NOT the full-batch gradient. The exact
     rule: local loss = (sum of my per-sample losses) / B_global, then all-reduce SUM (DDP divides
     by N, so under DDP it is N/B * sum). Both facts are shown with numbers at step 0.
  2. buckets (measured): one all-reduce per tensor vs one per bucket, packed as DDP packs them (last
     parameter first; a bucket closes once it holds --bucket-mb MiB), and DDP's own buckets read back.
  3. overlap (measured, explained): each bucket's all-reduce launched from gradient hooks while
     backward still runs, vs after backward; overlap = (comm + compute - t) / min(comm, compute), as
     in lesson 02, and what lets an all-reduce run beside backward on the transport that ran.

Run it:
  make lesson-08 NP=4                         (API=torch; ARGS="--dtype float32 --bucket-mb 0.0625")
  .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py lessons/08_data_parallel.py --api mpi4py

Read next: lessons/data_parallel/ (show.py: the tables and what the overlap figures can say;
torch_ddp.py: DDP's own buckets, read back), then lesson 09: reduce-scatter and all-to-all.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import bootstrap, report, shards, timing  # noqa: E402
from lessons.data_parallel import budget, show, torch_ddp  # noqa: E402

SEED = 8                   # data and models come from this seed (--seed), identical on every rank
BATCH = 130                # global batch: 130 % 3 == 1, 130 % 4 == 2, so shards are uneven at NP 3, 4
FEATURES, HIDDEN = 6, 16   # part 1's MLP: FEATURES -> HIDDEN -> tanh -> 1
STEPS = 5                  # optimizer steps in part 1
LR, MOMENTUM = 0.05, 0.9   # SGD with momentum, the same for (a), (b), (c)
DTYPES = ("float32", "float64")  # parity is graded against common/tolerance.py's budget for the dtype
DEPTH, WIDTH = 32, 64      # parts 2-3: DEPTH bias-free WIDTH x WIDTH layers, all tensors one size
DEEP_BATCH = 64            # rows per rank in parts 2-3
BUCKET_MB = 0.25           # bucket cap: float64 S = 32 KiB, so 8 layers per bucket, 4 buckets
REPS = 5                   # timed repetitions in parts 2-3 (median reported)
NUDGE = 0.01               # (c) starts from weights moved by NUDGE*rank: DDP's broadcast must undo it
DDP_STEPS = 3              # DDP rebuilds its buckets after the first backward and reports them after 3


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
def tiny_mlp(torch, dtype, device, seed=SEED):
    torch.manual_seed(seed)  # same seed on every rank: (a) and (b) start equal without a broadcast
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
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, FEATURES, generator=gen, dtype=torch.float64)
    y = (x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(args.batch, 1, generator=gen,
                                                              dtype=torch.float64))
    x, y = x.to(dtype=dtype, device=device), y.to(dtype=dtype, device=device)
    lo, hi = shards.chunk_bounds(args.batch, n)[rank]
    xr, yr = x[lo:hi], y[lo:hi]  # my slice; may be empty when batch < NP: it then adds zeros

    models = {k: tiny_mlp(torch, dtype, device, args.seed) for k in "abc"}
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
    drift = budget.Drift(torch, args.dtype, args.batch, args.lr, MOMENTUM)  # the oracle's budgets, per element
    drift.step(full, opts["b"], x, y)                                       # step 0's gradient budget
    full.zero_grad()
    mom = models["a"]  # mean of per-rank means: each rank's own mean loss, all-reduced, / N
    per_sample_loss(mom, xr, yr).sum().div(max(hi - lo, 1)).backward()
    for p in mom.parameters():
        allreduce_sum(ctx, p.grad)
        p.grad /= n
    mom_err = float((flat_grads(torch, mom) - g_full).abs().max())
    mom_ratio = budget.ratio(torch, [flat_grads(torch, mom)], [g_full], drift.first)
    mom.zero_grad()
    ddp = models["c"]  # DDP with the exact rule's sum / B but no * N: DDP divides by N
    (per_sample_loss(ddp, xr, yr).sum() / args.batch).backward()
    ddp_ratio = float(flat_grads(torch, ddp.module).norm() / g_full.norm())
    ddp.zero_grad()

    exact_err = exact_ratio = None
    for step in range(args.steps):
        for opt in opts.values():
            opt.zero_grad()
        data_parallel_backward(ctx, models["a"], xr, yr, args.batch)                       # (a)
        per_sample_loss(models["b"], x, y).mean().backward()                                # (b)
        (per_sample_loss(models["c"], xr, yr).sum() * n / args.batch).backward()           # (c)
        ga, gb = flat_grads(torch, models["a"]), flat_grads(torch, models["b"])
        if step == 0:
            exact_err, exact_ratio = float((ga - gb).abs().max()), budget.ratio(torch, [ga], [gb], drift.first)
        drift.step(models["b"], opts["b"], x, y)       # (b)'s gradient, per-sample magnitudes, momentum
        for opt in opts.values():
            opt.step()
        drift.after(opts["b"], models["b"])
    if ctx.device == "gpu":
        torch.cuda.synchronize()

    pa, pb, pc = (list(models[k].parameters()) for k in "abc")
    vs0 = vs_rank0(ctx, pa + pc)
    ratios = {f"{k}_ratio": budget.ratio(torch, u, w, drift.dp) for k, u, w in
              (("a_vs_b", pa, pb), ("a_vs_c", pa, pc), ("c_vs_b", pc, pb))}  # |diff| / budget, worst element
    return {"shard": hi - lo, "a_vs_b": max_diff(pa, pb), "a_vs_c": max_diff(pa, pc),
            "c_vs_b": max_diff(pc, pb), **ratios, "budget_max": float(drift.dp.max()), "vs_rank0": vs0,
            "exact_grad_err": exact_err, "exact_grad_ratio": exact_ratio, "mom_grad_ratio": mom_ratio,
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


def deep_mlp(torch, dtype, device):
    torch.manual_seed(SEED + 1)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.Tanh()]
        torch.nn.init.normal_(layers[-2].weight, std=WIDTH ** -0.5)  # gain 1: grads do not vanish in depth
    return torch.nn.Sequential(*layers).to(dtype=dtype, device=device)


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
    gen = torch.Generator().manual_seed(args.seed + 2 + rank)  # each rank its own rows
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
    bound = budget.across_ranks(ctx, torch, local, args.dtype)  # two all-reduces of these: 2 gamma_{N-1} sum|g_r|
    bucket_ratio = budget.ratio(torch, [p.grad for p in params], by_param, bound)
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
    overlap_ratio = budget.ratio(torch, [p.grad for p in params], after, bound)

    def overlapped():
        buckets.arm()
        backward()
        buckets.finish()

    buckets.done = []
    times = timed(ctx, {"compute": backward, "comm": buckets.after_backward,
                        "after": lambda: (backward(), buckets.after_backward()), "overlapped": overlapped},
                  args.reps, sync)
    buckets.remove()
    theirs, first = torch_ddp.ddp_buckets(ctx, deep_mlp(torch, dtype, device), cap, x, DDP_STEPS)  # DDP's own
    uneven = torch_ddp.uneven_buckets(ctx, tiny_mlp(torch, dtype, device), pack_buckets,  # and where sizes differ
                                      torch.ones(2, FEATURES, dtype=dtype, device=device), DDP_STEPS)
    sizes = [p.numel() * p.element_size() for p in params]
    comm, compute = times["comm"], times["compute"]
    return {"bucket_ratio": bucket_ratio, "overlap_ratio": overlap_ratio}, {
        "calls_per_param": len(params), "calls_bucketed": len(buckets.plan), "buckets": buckets.plan,
        "ddp_buckets": theirs, "ddp_first_backward_buckets": first, "ddp_same_buckets": theirs == buckets.plan,
        "first_bucket_head": buckets.plan[0][0], "bucketed_bytes": sum(sizes[i] for b in buckets.plan for i in b),
        "bucket_bytes": [sum(sizes[i] for i in b) for b in buckets.plan], **uneven,
        "done_after_backward": [min(buckets.done), max(buckets.done)],
        "time_us_per_param": t2["per_param"] * 1e6, "time_us_bucketed": t2["bucketed"] * 1e6,
        **{f"time_us_{k}": t * 1e6 for k, t in times.items()},
        "overlap_after": overlap_of(times["after"], comm, compute),
        "overlap_hooks": overlap_of(times["overlapped"], comm, compute)}


def overlap_of(t, t_comm, t_comp):
    """Share of the shorter part hidden behind the longer: 0 none, 1 all."""
    return (t_comm + t_comp - t) / min(t_comm, t_comp) if min(t_comm, t_comp) > 0 else 0.0


def flags():
    parser = bootstrap.lesson_parser(__file__, __doc__)
    parser.add_argument("--steps", type=bootstrap.positive(int), default=STEPS,
                        help=f"training steps (default {STEPS})")
    parser.add_argument("--batch", type=bootstrap.positive(int), default=BATCH, help=f"global batch (default {BATCH})")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--seed", type=int, default=SEED, help=f"data and model seed (default {SEED})")
    parser.add_argument("--lr", type=bootstrap.positive(float), default=LR, help=f"SGD learning rate (default {LR})")
    parser.add_argument("--bucket-mb", type=bootstrap.positive(float), default=BUCKET_MB,
                        help=f"bucket cap in MiB (default {BUCKET_MB})")
    parser.add_argument("--reps", type=bootstrap.positive(int), default=REPS,
                        help=f"timed repetitions (default {REPS})")
    return parser


def torch_for(ctx, args):
    """(torch, device, params): torch on one thread per rank, so NP ranks do not fight over the cores
    with NP thread pools; on --api mpi4py a torch process group for DDP from the MPI ranks."""
    import torch  # the model is torch on both apis
    torch.set_num_threads(1)
    device = torch.device("cuda", ctx.gpu) if ctx.device == "gpu" else torch.device("cpu")
    if ctx.api != "torch":
        bootstrap.init_torch(ctx)  # ddp needs a torch process group: gloo (nccl on gpu) from the mpi ranks
    itemsize = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    params = {"batch": args.batch, "steps": args.steps, "dtype": args.dtype, "itemsize": itemsize,
              "lr": args.lr, "momentum": MOMENTUM, "seed": args.seed, "depth": DEPTH, "width": WIDTH,
              "bucket_mb": args.bucket_mb, "cap_bytes": int(args.bucket_mb * 2 ** 20), "reps": args.reps}
    return torch, device, params


def main():
    args, ctx = bootstrap.start(__file__, flags(), uses_torch=True)  # the model is torch on both apis
    torch, device, params = torch_for(ctx, args)                     # one thread per rank; DDP's group

    show.heading1(ctx, args, MOMENTUM)
    row = part1(ctx, args, torch, device)                            # 1. (a) by hand, (b) one process, (c) DDP
    show.part1(ctx, args, ctx.comm.gather(row, root=0), NUDGE)       # the averaging facts, the budget

    show.heading2(ctx, args, params)
    values, summary = parts23(ctx, args, torch, device)              # 2. buckets, 3. overlap from hooks
    show.parts23(ctx, summary, ctx.comm.gather(values, root=0), DDP_STEPS)  # tables; where overlap runs
    params["ddp_buckets_read"] = int(summary["ddp_buckets"] is not None)  # an older torch may not say
    if ctx.api != "torch":
        import torch.distributed as dist
        dist.destroy_process_group()  # we built it for DDP; report.finish tears down only torch's own
    report.finish(ctx, {**row, **values}, summary=summary, params=params)


if __name__ == "__main__":
    main()
