"""What a lesson shows and reports, called with ctx: rank-ordered output for people, one results JSON
for the runner.

    report.section(ctx, "2. all-reduce")          # rank 0 prints a heading
    report.say(ctx, f"sum = {total}")             # every rank calls; rank 0 prints it once if alike
    report.finish(ctx, {"sum": total}, summary={...})   # once per rank, at the end

A barrier does not order stdout (each rank's pipe is separate), so ordered output is gathered to rank 0.
The text itself (tables, merged per-rank lines, lists shortened with a count) is common/text.py's.
"""
import json
import os
import sys
import tempfile

from common.plumbing import guard
from common.text import merge, plain_marks

plain_marks(sys.stdout, sys.stderr)  # a rank whose terminal cannot print a mark writes a look-alike


def section(ctx, title):
    if ctx.rank == 0:
        print(f"\n== {title}", flush=True)


def say(ctx, text):
    """Collective: rank 0 prints every rank's text once, merged: what all ranks say alike once, as
    `[all ranks]`, and only what differs per rank (or per group of ranks that say the same)."""
    texts = ctx.comm.gather(str(text), root=0)
    if ctx.rank == 0:
        print("\n".join(merge(texts)), flush=True)


def _plain(value):
    """numpy scalars and arrays into JSON's types."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot put {type(value).__name__} in the results JSON")


def atomic_write(path, text):
    """Write a temp file in the same folder, then rename: a reader sees the old file or the new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path, doc):
    """The results JSON: into the run folder the runner made, or through the guard (common/plumbing/guard.py)
    when a lesson run by hand is given --json: never over a file the kit did not write."""
    text = json.dumps(doc, indent=1, default=_plain) + "\n"
    if path == os.environ.get("TUTOR_RESULTS"):
        atomic_write(path, text)
    else:
        guard.write(path, text, "results JSON", "--json")


def write_csv(path, rows):
    """Rows (dicts with the same keys) as CSV with a header line, written atomically through the guard
    (common/plumbing/guard.py: never over a file the kit did not write; guard.Refused says why)."""
    import csv
    import io
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    guard.write(path, text.getvalue(), "CSV", "--csv")


def finish(ctx, values, summary=None, params=None):
    """Collective, once per rank: gather values to rank 0, write the JSON there, tear down."""
    mine = {"rank": ctx.rank, **values}
    ranks = ctx.comm.gather(mine, root=0)
    doc = None
    if ctx.rank == 0:
        doc = {"lesson": ctx.lesson, "np": ctx.world_size, "api": ctx.api, "device": ctx.device,
               "transport": ctx.transport, "params": params if params is not None else ctx.params,
               "ranks": ranks, "summary": summary or {},
               "loaded": [m for m in ("torch", "cupy") if m in sys.modules]}  # what this path paid to import
        if ctx.json_path:
            write_json(ctx.json_path, doc)
    if ctx.api == "torch":
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    return doc
