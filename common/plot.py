"""Pictures as PNG files, drawn with matplotlib's Agg backend (no window, no display needed).

    problem = plot.cannot_write(path)      # None, or one line saying why not (before any work is done)
    plot.busbw_png(path, sizes_b, {"ring": [...], "library": [...]}, title)   # lesson 05's race
    plot.times_png(path, sizes_b, {"ring": ([measured s], [predicted s]), ...}, title)   # lesson 07
    plot.schedule_png(path, {"ring": grid}, count, title)   # who sends which slice to whom, per step
        grid[rank][step] = (sends [(lo, hi, peer)], recvs [(lo, hi, peer, "add" | "copy")])

Every function is pure (data in, file out) and imports matplotlib only when called: a run without a
picture never pays for it.
"""
import importlib.util

from common import guard

CELL_W, CELL_H = 0.55, 0.42        # inches per step and per rank in a schedule picture
DPI = 100


def cannot_write(path):
    """Why a PNG cannot be written at `path` (no folder, a file the kit did not write: common/guard.py,
    no matplotlib), or None. Cheap: imports nothing."""
    problem = guard.refusal(path, "PNG")
    if problem:
        return problem
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
        guard.write(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"), "PNG")
    finally:
        plt.close(fig)
    return f"wrote {path}"


def busbw_png(path, sizes_b, series, title):
    """busbw (GB/s) against size (bytes, log 2), one line per series = {label: [GB/s per size]}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, vals in series.items():
        ax.plot(sizes_b, vals, marker="o", label=label)
    _bytes_axis(ax)
    ax.set(xlabel="size (bytes)", ylabel="busbw (GB/s)", title=title)
    ax.grid(True, alpha=0.3)
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
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(plt, fig, path)


def schedule_png(path, grids, count, title):
    """One panel per schedule (grids = {label: grid}), ranks down, steps across. In each cell the buffer
    [0, count) is a grey strip: the top half shows the slices this rank sends, coloured by the rank they
    go to; the bottom half the slices it receives, coloured by the rank they come from, hatched when
    they are added (copied otherwise). The text says to whom (->) and from whom (<-)."""
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle
    n = max(len(g) for g in grids.values())
    steps = max([len(row) for g in grids.values() for row in g] + [1])
    width = max(6.0, 1.2 + steps * CELL_W * 2)
    heights = [max(len(g), 1) * CELL_H * 2 + 0.6 for g in grids.values()]
    fig, axes = plt.subplots(len(grids), 1, figsize=(width, sum(heights) + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    span = max(count, 1)
    for ax, (label, grid) in zip(axes[:, 0], grids.items()):
        for rank, row in enumerate(grid):
            for step, (sends, recvs) in enumerate(row):
                x, y = step, len(grid) - 1 - rank
                ax.add_patch(Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, color="0.92"))
                for lo, hi, peer in sends:
                    ax.add_patch(Rectangle((x + 0.05 + 0.9 * lo / span, y + 0.5), 0.9 * max(hi - lo, 0) / span,
                                           0.4, color=f"C{peer % 10}"))
                for lo, hi, peer, op in recvs:
                    ax.add_patch(Rectangle((x + 0.05 + 0.9 * lo / span, y + 0.1), 0.9 * max(hi - lo, 0) / span,
                                           0.4, facecolor=f"C{peer % 10}", alpha=0.55,
                                           hatch="///" if op == "add" else None, edgecolor="white", lw=0))
                words = ",".join(str(p) for _, _, p in sends)
                back = ",".join(str(p) for _, _, p, _ in recvs)
                text = (f"->{words}" if words else "") + (" " if words and back else "") + \
                       (f"<-{back}" if back else "")
                if text:
                    ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=6,
                            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8})
        ax.set_xlim(0, max(len(row) for row in grid) if grid and grid[0] else 1)
        ax.set_ylim(0, len(grid))
        ax.set_yticks([len(grid) - 0.5 - r for r in range(len(grid))], [f"rank {r}" for r in range(len(grid))],
                      fontsize=7)
        ax.set_xticks([s + 0.5 for s in range(len(grid[0]) if grid else 0)],
                      [str(s + 1) for s in range(len(grid[0]) if grid else 0)], fontsize=7)
        ax.set_title(label, fontsize=9, loc="left")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    axes[-1, 0].set_xlabel(f"step (each cell: the buffer of {count} elements; top: sent, bottom: received, "
                           "hatched: added)", fontsize=8)
    fig.legend(handles=[Patch(color=f"C{r % 10}", label=f"rank {r}") for r in range(n)],
               loc="upper right", fontsize=7, ncol=min(n, 8), title="to / from", title_fontsize=7)
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))  # room for the title and legend
    return _save(plt, fig, path)
