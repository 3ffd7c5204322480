"""What a lesson shows and reports: rank-ordered output for people, one results JSON for the runner.

    report.section(ctx, "2. all-reduce")          # rank 0 prints a heading
    report.say(ctx, f"sum = {total}")             # every rank calls; rank 0 prints it once if alike
    report.finish(ctx, {"sum": total}, summary={...})   # once per rank, at the end

A barrier does not order stdout (each rank's pipe is separate), so ordered output is gathered to rank 0.
"""
import difflib
import json
import os
import sys
import tempfile

from common.plumbing import guard
from common.text import plain_marks

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


def merge(texts):
    """Pure: one text per rank (rank order) -> the lines to print, each tagged with who said it.

    Lines every rank has, in the same order, print once as `[all ranks]`; between them, each rank's
    own lines print as a block under `[rank r/N]`, or `[ranks 1-3/N]` for ranks whose blocks are equal.
    """
    n = len(texts)
    lines = [str(t).splitlines() or [""] for t in texts]
    common = lines[0]
    for other in lines[1:]:  # a subsequence of every rank's lines, so it can be found in each
        blocks = difflib.SequenceMatcher(None, common, other, autojunk=False).get_matching_blocks()
        common = [line for i, _, size in blocks for line in common[i:i + size]]
    out, start = [], [0] * n
    for line in common + [None]:
        stop = [len(mine) if line is None else mine.index(line, at)
                for mine, at in zip(lines, start)]
        out += _differing([tuple(mine[a:b]) for mine, a, b in zip(lines, start, stop)])
        if line is not None:
            out.append((range(n), line))
            start = [b + 1 for b in stop]
    tags = [rank_tag(ranks, n) for ranks, _ in out]
    width = max(map(len, tags))
    return [f"{tag:<{width}} {line}".rstrip() for tag, (_, line) in zip(tags, out)]


def _differing(blocks):
    """Each rank's lines between two shared lines: one block per group of ranks that hold the same."""
    if len(set(blocks)) == 1:
        return [(range(len(blocks)), line) for line in blocks[0]]
    groups = {}
    for rank, block in enumerate(blocks):
        groups.setdefault(block, []).append(rank)
    return [(ranks, line) for block, ranks in groups.items() for line in block]


def rank_tag(ranks, n):
    """`[all ranks]`, `[rank 2/4]`, `[ranks 1-3/4]`, `[ranks 0,2/4]` (pure)."""
    ranks = list(ranks)
    if n > 1 and len(ranks) == n:
        return "[all ranks]"
    if len(ranks) == 1:
        return f"[rank {ranks[0]}/{n}]"
    spans, first = [], ranks[0]
    for prev, r in zip(ranks, ranks[1:] + [None]):
        if r is None or r != prev + 1:  # a run of consecutive ranks ends at prev
            spans.append(str(first) if first == prev else f"{first}-{prev}")
            first = r
    return f"[ranks {','.join(spans)}/{n}]"


def brief(values, limit=8):
    """A list for a line of text: whole up to `limit` items, else its count, first three and last
    (`[0, 1, 2, ..., 19] (20 values)`); the results JSON keeps every value (pure)."""
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(values) <= limit:
        return "[" + ", ".join(_fmt(v) for v in values) + "]"
    shown = ", ".join(_fmt(v) for v in values[:3])
    return f"[{shown}, ..., {_fmt(values[-1])}] ({len(values)} values)"


def per_rank(values):
    """A table cell of per-rank numbers: all of them up to 4 ranks, else `lowest .. highest` (pure)."""
    values = list(values)
    return " ".join(map(str, values)) if len(values) <= 4 else f"{min(values)} .. {max(values)}"


def once(rows):
    """Rows (rank, values...) from every rank, in rank order: consecutive ranks with equal values make
    one row ('0-2'; 'all' when every rank's are equal) (pure)."""
    groups = []
    for r in rows:
        if groups and tuple(groups[-1][-1][1:]) == tuple(r[1:]):
            groups[-1].append(r)
        else:
            groups.append([r])
    if len(groups) == 1:
        return [("all",) + tuple(rows[0][1:])]
    return [(f"{g[0][0]}-{g[-1][0]}" if len(g) > 1 else g[0][0],) + tuple(g[0][1:]) for g in groups]


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
