"""What a lesson shows and reports: rank-ordered output for people, one results JSON for the runner.

    report.section(ctx, "2. all-reduce")          # rank 0 prints a heading
    report.say(ctx, f"sum = {total}")             # every rank calls; rank 0 prints all, in rank order
    report.finish(ctx, {"sum": total}, summary={...})   # once per rank, at the end

A barrier does not order stdout (each rank's pipe is separate), so ordered output is gathered to rank 0.
"""
import json
import os
import sys
import tempfile


def section(ctx, title):
    if ctx.rank == 0:
        print(f"\n== {title}", flush=True)


def say(ctx, text):
    """Collective: every rank's text, printed by rank 0 as `[rank r/N] line`, rank by rank."""
    texts = ctx.comm.gather(str(text), root=0)
    if ctx.rank == 0:
        width = len(str(ctx.world_size - 1))
        for r, t in enumerate(texts):
            for line in t.splitlines() or [""]:
                print(f"[rank {r:>{width}}/{ctx.world_size}] {line}")
        print(end="", flush=True)


def table(headers, rows, align=None):
    """A plain-text table: numbers right-aligned, text left-aligned (pure, no MPI)."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = align or [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
                            for r in rows) if rows else False for i in range(len(headers))]

    def line(items):
        return "  ".join(s.rjust(w) if num else s.ljust(w)
                         for s, w, num in zip(items, widths, numeric)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


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
    atomic_write(path, json.dumps(doc, indent=1, default=_plain) + "\n")


def write_csv(path, rows):
    """Rows (dicts with the same keys) as CSV with a header line, written atomically."""
    import csv
    import io
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, text.getvalue())


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
