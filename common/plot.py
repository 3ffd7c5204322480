"""Pictures as PNG files (PDF or SVG where the file's suffix names them), drawn with matplotlib's Agg
backend (no window, no display needed).

    problem = plot.cannot_write(path)      # None, or one line saying why not (before any work is done)
    plot.busbw_png(path, sizes_b, {"ring": [...], "library": [...]}, title)   # lesson 05's race
    plot.times_png(path, sizes_b, {"ring": ([measured s], [predicted s]), ...}, title)   # lesson 07
    plot.schedule_png(path, {"ring": grid}, count, title)   # who sends which slice to whom, per step
        grid[rank][step] = (sends [(lo, hi, peer)], recvs [(lo, hi, peer, "add" | "copy")])
    plot.phases(grid)                      # [(first step, last step, "reduce-scatter" | ...)], named
                                           # from what the steps do; drawn above them

Every function is pure (data in, file out) and imports matplotlib only when called: a run without a
picture never pays for it.
"""
import importlib.util
import os

from common.plumbing import guard

CELL_W, CELL_H = 0.55, 0.42        # inches per step and per rank in a schedule picture
DPI = 100


FORMATS = ("png", "pdf", "svg")    # what the file's suffix may name; none: PNG


def file_format(path):
    """The picture format `path`'s suffix names ('png' without one), or None for another suffix."""
    suffix = os.path.splitext(str(path))[1][1:].lower()
    if not suffix:
        return "png"
    return suffix if suffix in FORMATS else None


def cannot_write(path):
    """Why a picture cannot be written at `path` (a suffix no format here has, no folder, a file the kit
    did not write: common/plumbing/guard.py, no matplotlib), or None. Cheap: imports nothing."""
    problem = guard.refusal(path, "PNG")  # first: a file the kit did not write is the news
    if problem:
        return problem
    if file_format(path) is None:
        return (f"{path}: the suffix names the picture's format: "
                f"{', '.join('.' + f for f in FORMATS)}, not {os.path.splitext(str(path))[1]}")
    if importlib.util.find_spec("matplotlib") is None:
        return "PNG pictures need matplotlib: .venv/bin/pip install matplotlib (or `make setup`)"
    return None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _bytes_axis(ax):
    """Log-2 x axis labelled 1K, 64K, 1M as nccl-tests' sizes are written."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    from common.bandwidth import human
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human(int(round(v)))))


def _save(plt, fig, path):
    try:  # through the guard: never over a file the kit did not write
        guard.write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format=file_format(path)), "PNG")
    finally:
        plt.close(fig)
    return f"wrote {path}"


def busbw_png(path, sizes_b, series, title):
    """busbw (GB/s) against size (bytes, log 2), one line per series = {label: [GB/s per size]}. The
    y axis is log too: small sizes run at a thousandth of the large ones' busbw, and a linear axis
    would flatten them to zero, where the ring loses to the library."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, vals in series.items():  # a zero (nothing timed) has no place on a log axis: a gap
        ax.plot(sizes_b, [v if v > 0 else float("nan") for v in vals], marker="o", label=label)
    _bytes_axis(ax)
    ax.set_yscale("log")
    ax.set(xlabel="size (bytes)", ylabel="busbw (GB/s, log)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(plt, fig, path)


def times_png(path, sizes_b, series, title):
    """Measured (solid) and predicted (dashed) seconds against size, one colour per
    series = {label: ([measured s per size], [predicted s per size])}; both axes log."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (label, (measured, predicted)) in enumerate(series.items()):
        colour = f"C{i % 10}"
        ax.plot(sizes_b, [t * 1e6 for t in measured], marker="o", color=colour, label=f"{label} measured")
        ax.plot(sizes_b, [t * 1e6 for t in predicted], ls="--", marker="x", color=colour,
                label=f"{label} predicted")
    _bytes_axis(ax)
    ax.set_yscale("log")
    ax.set(xlabel="size (bytes)", ylabel="time (us)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # off the lines
    fig.tight_layout()
    return _save(plt, fig, path)


def phases(grid):
    """[(first step, last step, name)]: runs of steps whose arriving slices are all added or all copied,
    named by what they do. add: 'reduce-scatter' when every rank sends and receives part of the buffer
    at every step, 'all-reduce' when the whole buffer, else 'reduce'; copy: 'all-gather' / 'copy' /
    'broadcast' the same way; steps that add and copy at once: 'add and copy'."""
    steps = max([len(row) for row in grid] + [0])
    kinds = []
    for step in range(steps):
        cells = [row[step] if step < len(row) else ([], []) for row in grid]
        ops = {op for _, recvs in cells for *_, op in recvs}
        every = all(sends and recvs for sends, recvs in cells)
        whole = every and all(hi - lo == max(h for _, rs in cells for _, h, _, _ in rs)
                              and lo == 0 for _, recvs in cells for lo, hi, _, _ in recvs)
        if ops == {"add"}:
            kinds.append("all-reduce" if whole else "reduce-scatter" if every else "reduce")
        elif ops == {"copy"}:
            kinds.append("copy" if whole else "all-gather" if every else "broadcast")
        else:
            kinds.append("add and copy" if ops else "")
    out = []
    for step, kind in enumerate(kinds):
        if out and out[-1][2] == kind:
            out[-1] = (out[-1][0], step, kind)
        else:
            out.append((step, step, kind))
    return [run for run in out if run[2]]


WHAT = {"reduce-scatter": "slices arrive and are added", "all-reduce": "the whole buffer, added",
        "reduce": "slices arrive and are added", "all-gather": "finished slices arrive and are copied",
        "copy": "the whole buffer, copied", "broadcast": "slices arrive and are copied",
        "add and copy": "some slices added, some copied"}


def schedule_png(path, grids, count, title):
    """One panel per schedule (grids = {label: grid}), ranks down, steps across, every panel on the
    same scale. In each cell the buffer [0, count) is a grey strip: the upper bar shows the slices this
    rank sends, coloured by the rank they go to; the lower bar the slices it receives, coloured by the
    rank they come from, hatched when they are added (copied otherwise); under them, to whom and from
    whom. Above the steps, each phase's name (phases()); at the end of a reduce-scatter, the slice each
    rank has finished (summed over every rank) is outlined."""
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle
    n = max(len(g) for g in grids.values())
    steps = max([len(row) for g in grids.values() for row in g] + [1])
    width = max(6.5, 1.3 + steps * CELL_W * 2.4)
    heights = [max(len(g), 1) * CELL_H * 2 + 0.7 for g in grids.values()]
    fig, axes = plt.subplots(len(grids), 1, figsize=(width, sum(heights) + 1.3), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    span = max(count, 1)
    for ax, (label, grid) in zip(axes[:, 0], grids.items()):
        rows = len(grid)
        for rank, row in enumerate(grid):
            for step, (sends, recvs) in enumerate(row):
                x, y = step, rows - 1 - rank
                ax.add_patch(Rectangle((x + 0.05, y + 0.3), 0.9, 0.64, color="0.92"))
                for lo, hi, peer in sends:
                    ax.add_patch(Rectangle((x + 0.05 + 0.9 * lo / span, y + 0.63), 0.9 * max(hi - lo, 0) / span,
                                           0.31, color=f"C{peer % 10}"))
                for lo, hi, peer, op in recvs:
                    ax.add_patch(Rectangle((x + 0.05 + 0.9 * lo / span, y + 0.3), 0.9 * max(hi - lo, 0) / span,
                                           0.31, facecolor=f"C{peer % 10}", alpha=0.55,
                                           hatch="///" if op == "add" else None, edgecolor="white", lw=0))
                words = ",".join(str(p) for _, _, p in sends)
                back = ",".join(str(p) for _, _, p, _ in recvs)
                text = "  ".join(t for t in (f"to {words}" if words else "", f"from {back}" if back else "") if t)
                if text:
                    ax.text(x + 0.5, y + 0.15, text, ha="center", va="center", fontsize=6.5)
        for first, last, kind in phases(grid):
            ax.annotate("", (first + 0.05, rows + 0.12), (last + 0.95, rows + 0.12),
                        arrowprops={"arrowstyle": "|-|", "lw": 0.8, "color": "0.3",
                                    "shrinkA": 0, "shrinkB": 0, "mutation_scale": 3})
            ax.text((first + last + 1) / 2, rows + 0.3, f"{kind}: {WHAT[kind]}" if last > first else kind,
                    ha="center", va="center", fontsize=7.5, color="0.15")
            if kind == "reduce-scatter":  # what each rank holds now: its finished slice
                for rank, row in enumerate(grid):
                    for lo, hi, _, _ in row[last][1] if last < len(row) else []:
                        ax.add_patch(Rectangle((last + 0.05 + 0.9 * lo / span, rows - 1 - rank + 0.3),
                                               0.9 * max(hi - lo, 0) / span, 0.31, fill=False, lw=1.4,
                                               edgecolor="black"))
        ax.set_xlim(0, steps)
        ax.set_ylim(0, rows + 0.45)
        ax.set_yticks([rows - 0.4 - r for r in range(rows)], [f"rank {r}" for r in range(rows)], fontsize=7)
        used = max([len(row) for row in grid] + [0])
        ax.set_xticks([s + 0.5 for s in range(used)], [str(s + 1) for s in range(used)], fontsize=7)
        ax.set_title(label, fontsize=9, loc="left")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[-1, 0].set_xlabel(f"step; each cell: the buffer of {count} elements, upper bar sent, lower bar "
                           "received", fontsize=8)
    handles = [Patch(color=f"C{r % 10}", label=f"rank {r}") for r in range(n)]
    handles += [Patch(facecolor="0.6", hatch="///", edgecolor="white", label="added on arrival"),
                Patch(facecolor="0.6", label="copied on arrival"),
                Patch(fill=False, edgecolor="black", lw=1.4, label="finished: summed over every rank")]
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncol=min(len(handles), 5),
               title="colour: the rank a slice goes to or comes from", title_fontsize=7)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    return _save(plt, fig, path)
