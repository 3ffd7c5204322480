"""Lesson 08's printing (rank 0): part 1's differences and the two averaging facts, parts 2 and 3's
tables, and what the overlap figures show on the transport that ran.

    heading1(ctx, args, momentum), heading2(ctx, args, params)   each part's heading, before its work
    part1(ctx, args, rows, nudge)             every rank's differences, the budget; the averaging facts
    parts23(ctx, s, errs, ddp_steps)          buckets, DDP's own buckets, the overlap table
    where_it_runs(ctx, s)                     the sentences under the overlap table
"""
import os

from common import mpilib, report, text, timing


def heading1(ctx, args, momentum):
    report.section(ctx, f"1. {args.steps} SGD steps (lr {args.lr}, momentum {momentum}), batch {args.batch} "
                        f"on {ctx.world_size} ranks, {args.dtype}, {ctx.api} ({ctx.transport})")
    if ctx.rank == 0:
        print("(a) by hand  (b) one process, whole batch  (c) DDP", flush=True)


def heading2(ctx, args, params):
    depth, width = params["depth"], params["width"]
    report.section(ctx, f"2. buckets: {depth} tensors of {width}x{width} {args.dtype} "
                        f"({width * width * params['itemsize']} B each), cap {params['cap_bytes']} B")
    if ctx.rank == 0:
        print(f"time per step: median of {args.reps}, slowest rank", flush=True)


def where_it_runs(ctx, s):
    """What the overlap figures of part 3 show, and what lets an all-reduce run beside backward on the
    transport that ran (`s`: part 3's summary). The after-backward row cannot overlap: its figure
    (ideally 0) is how far measured parts fail to add up here. MPICH moves a non-blocking all-reduce
    only inside MPI calls made on this thread (the Test() calls of later hooks) unless its progress
    thread is on (MPIR_CVAR_ASYNC_PROGRESS=1, see lesson 02), and Open MPI 5, which has no such thread,
    only inside those calls; gloo runs it on its own worker threads, which need free cores; NCCL runs
    its kernels on their own CUDA stream beside backward's, which is where DDP's overlap comes from."""
    n = ctx.world_size
    cores = timing.usable_cores()
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
        lines.append("the hooks' figure is within 0.25 of 'backward, then all-reduce' (which cannot overlap): "
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


def part1(ctx, args, rows, nudge):
    """Rank 0 prints part 1: every rank's differences and their budget, then the two averaging facts."""
    if ctx.rank != 0:
        return
    n, d = ctx.world_size, rows[0]
    print(text.table(["rank", "shard", "max|a-b|", "max|a-c|", "max|c-b|", "worst/budget", "vs rank 0"],
                     [(r, x["shard"], x["a_vs_b"], x["a_vs_c"], x["c_vs_b"],
                       f"{max(x['a_vs_b_ratio'], x['a_vs_c_ratio'], x['c_vs_b_ratio']):.2g}", x["vs_rank0"])
                      for r, x in enumerate(rows)]))
    before, after = max(x["ddp_init_before"] for x in rows), max(x["ddp_init_after"] for x in rows)
    print(f"(c) started from weights moved by {nudge}*rank: largest difference from rank 0's {before:.3g} before "
          f"DDP(...),\n  {after:.3g} after: DDP broadcasts rank 0's parameters (and buffers) when it is built")
    print(text.wrapped(f"budget (common/tolerance.py, {args.dtype}): each gradient is one sum of B = {args.batch} "
                       f"per-sample terms added in its own order, k = B + 2 roundings on a term's path, so "
                       f"2 gamma_k * sum|g_i| / B per element, carried through SGD's updates (largest "
                       f"{d['budget_max']:.2g}); worst/budget: the largest |difference| / budget", hang=0))
    print(f"step-0 gradient vs the full batch's on rank 0, max abs difference (worst/budget):\n"
          f"  local loss = sum / B, all-reduce SUM (the exact rule):      "
          f"{d['exact_grad_err']:.3g} ({d['exact_grad_ratio']:.2g})\n"
          f"  local loss = my mean, all-reduce, / N (mean of the means): "
          f"{d['mom_grad_err']:.3g} ({d['mom_grad_ratio']:.2g})"
          f"\n  shards {[x['shard'] for x in rows] if n <= 8 else '...'}: "
          f"{'uneven, so wrong' if args.batch % n else 'equal, so right here'}\n"
          f"DDP divides the summed gradients by N: with local loss sum / B its gradient is "
          f"{d['ddp_unscaled_ratio']:.6g} x\n  the full batch's (1/N = {1 / n:.6g}),\n"
          f"  so (c) uses N / B * sum; with DDP's usual local mean loss you get the mean of the means",
          flush=True)


def parts23(ctx, s, errs, ddp_steps):
    """Rank 0 prints parts 2 and 3 (`s`: their summary, `errs`: every rank's checked differences)."""
    if ctx.rank != 0:
        return
    print(text.table(["all-reduce", "calls/step", "time us", "diff/budget"],
                     [("one per tensor", s["calls_per_param"], round(s["time_us_per_param"], 1), "reference"),
                      ("one per bucket", s["calls_bucketed"], round(s["time_us_bucketed"], 1),
                       f'{max(e["bucket_ratio"] for e in errs):.2g}')], align=[False, True, True, True]))
    shown = s["bucket_bytes"] if len(s["bucket_bytes"]) <= 8 else f"{s['bucket_bytes'][:8]} ..."
    print(text.wrapped(f"bucket bytes {shown} (the first starts at tensor {s['first_bucket_head']}, the last "
                       f"layer's); per-tensor / bucketed time = "
                       f"{s['time_us_per_param'] / max(s['time_us_bucketed'], 1e-9):.2f} (bucketed time includes "
                       "packing the grads into the buckets and copying the sums back)", hang=0))
    theirs = s["ddp_buckets"]
    if theirs is None:
        print("DDP's own buckets: this torch does not report them (_get_ddp_logging_data)")
    else:
        heads = [f"{b[0]}..{b[-1]}" for b in theirs]
        print(text.wrapped(f"DDP's own buckets for this model and cap, read from DDP after {ddp_steps} steps: its "
                           f"first backward used {s['ddp_first_backward_buckets']} bucket(s), then it rebuilt them "
                           f"in the order the gradients became ready: {len(theirs)} bucket(s), tensors "
                           f"{', '.join(heads[:8])}{' ...' if len(heads) > 8 else ''}: "
                           + ("the same as ours" if s["ddp_same_buckets"] else "NOT the same as ours"), hang=0))
        print(text.wrapped(f"where tensor sizes differ (part 1's MLP: {s['uneven_sizes']} B, a cap of "
                           f"{s['uneven_cap']} B): ours {s['uneven_buckets']}, DDP's {s['ddp_uneven_buckets']}: "
                           + ("the same" if s["ddp_same_uneven_buckets"] else "NOT the same"), hang=0))
    tc, tm, ta, th = (s[f"time_us_{k}"] for k in ("compute", "comm", "after", "overlapped"))
    report.section(ctx, "3. overlap: bucket all-reduces launched from gradient hooks during backward")
    print(text.table(["mode", "time us", "overlap"], [
        ("backward only (compute)", round(tc, 1), ""), ("bucketed all-reduce only (comm)", round(tm, 1), ""),
        ("backward, then all-reduce", round(ta, 1), f"{s['overlap_after']:+.2f}"),
        ("all-reduce from hooks (async)", round(th, 1), f"{s['overlap_hooks']:+.2f}")], align=[False, True, True]))
    worst = max(e["overlap_ratio"] for e in errs)
    print(f"overlapped grads vs after-backward grads: worst |diff| / budget = {worst:.2g}\n"
          f"(budget: two all-reduces of N = {ctx.world_size} gradients, 2 gamma_(N-1) * sum over ranks |g_r|)\n"
          f"overlap = (comm + compute - time) / min(comm, compute): 0 none, 1 all hidden; 'backward, then\n"
          f"all-reduce' cannot overlap, so its figure (ideally 0) is how far the parts fail to add up here")
    for line in where_it_runs(ctx, s):
        print(text.wrapped(line, hang=0))
    print(end="", flush=True)


