"""Lesson 02's hazards twice: plain, where the outcome is down to timing, then under common/sanitize.py,
where each fails the same way every run and is named by its line (the lesson's --sanitize or not)."""
from common import sanitize


def twice(ctx, hazards, count):
    """(plain outcomes, sanitized outcomes, the sanitizer's reports) of this rank's hazards(ctx, comm,
    count). Collective."""
    with sanitize.using(None):  # plain, even on a --sanitize run
        plain = hazards(ctx, ctx.comm, count)
    ctx.comm.Barrier()
    if ctx.api == "torch":
        sanitize.patch_torch()
    with sanitize.using(sanitize.Sanitizer(strict=False, rank=ctx.rank, quiet=True)) as san:
        checked = hazards(ctx, sanitize.comm(ctx.comm), count)
    return plain, checked, san.reports
