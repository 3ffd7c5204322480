"""Lesson 08's look at torch's own buckets: the ones DistributedDataParallel builds for a model and a
cap, read back from DDP after it rebuilds them, so the lesson can check that they are the buckets its
pack_buckets makes by hand: for the deep model (one tensor size) and for part 1's MLP (four sizes).

DDP's defaults: bucket_cap_mb 25 MiB with a first bucket (the gradients ready first) of 1 MiB; for the
first backward it puts every gradient in one bucket, then rebuilds the buckets in the order the
gradients became ready, and reports them in its logging data.
"""


def ddp_buckets(ctx, model, cap, x, steps):
    """([[param index]] DDP rebuilt after the first backward, how many buckets the first backward used)
    for `model` wrapped in DDP with a `cap`-byte bucket cap; (None, None) if this torch does not report
    them. `steps` forward/backward passes on x, on every rank (collective)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, device_ids=[ctx.gpu] if ctx.device == "gpu" else None, bucket_cap_mb=cap / 2 ** 20)
    first = None
    for _ in range(steps):
        ddp(x).sum().backward()
        first = first or ddp._get_ddp_logging_data().get("bucket_sizes")
    got = ddp._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices")
    if not got or not first:
        return None, None
    return [[int(i) for i in b.split()] for b in got.split(",")], len(str(first).split(","))


def uneven_buckets(ctx, model, pack, x, steps):
    """The lesson's pack (pack_buckets) against DDP's own buckets where the tensors differ in size: the
    deep model's are all one size, which hides a size read one index off or a bucket's byte count started
    one off. `model`'s tensors, with a cap one byte past its last two: the first bucket must close at the
    third. Returns the summary's entries (DDP's None where this torch does not report them)."""
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    cap = sizes[-1] + sizes[-2] + 1 if len(sizes) > 1 else 1
    ours = pack(sizes, cap)
    theirs, _ = ddp_buckets(ctx, model, cap, x, steps)
    return {"uneven_sizes": sizes, "uneven_cap": cap, "uneven_buckets": ours, "ddp_uneven_buckets": theirs,
            "ddp_same_uneven_buckets": theirs == ours}
