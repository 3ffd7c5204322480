"""common/plot.py's pictures: each PNG has the size its figure asks for and is not blank. Lessons 05 and
07 draw them from a run (one small mpiexec run each, NP 2: the rows a real race and model produce)."""
import json
import os
import subprocess
import sys

import pytest

from common import plot, shards
from common.runner import mpi_launchers
from conftest import ROOT, load_lesson
from lessons.allreduce_algorithms import schedules as sched

pytest.importorskip("matplotlib")
ring = load_lesson("05_ring_allreduce.py")
zoo = load_lesson("07_allreduce_algorithms.py")


def picture(path):
    """(height, width, distinct colours) of a PNG, colours rounded to 1/32 so antialiasing adds few."""
    from matplotlib.image import imread
    img = imread(str(path))
    h, w = img.shape[:2]
    colours = {tuple(int(c * 32) for c in px[:3]) for px in img.reshape(-1, img.shape[2])[::7]}
    return h, w, len(colours)


def assert_drawn(path, size=None, colours=6):
    assert os.path.getsize(path) > 0, f"{path} is empty"
    h, w, n = picture(path)
    if size:
        assert (w, h) == size, f"{path}: {w}x{h} pixels, not {size[0]}x{size[1]}"
    assert n >= colours, f"{path} is blank: {n} colours"


def test_the_blank_check_can_fail(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(3, 2))
    fig.savefig(tmp_path / "blank.png", dpi=plot.DPI)
    plt.close(fig)
    with pytest.raises(AssertionError, match="blank"):
        assert_drawn(tmp_path / "blank.png", (300, 200))
    with pytest.raises(AssertionError, match="not 700x400"):
        assert_drawn(tmp_path / "blank.png", (700, 400), colours=1)


def test_schedule_picture_from_the_real_schedules(tmp_path):
    """Lesson 05's ring_schedule and lesson 07's schedules, every rank's rounds, as the runs would draw."""
    n, count = 4, 7
    bounds = shards.chunk_bounds(count, n)
    ring05 = [[([(*bounds[s], (r + 1) % n)], [(*bounds[v], (r - 1) % n, "add" if ph == "reduce-scatter" else "copy")])
               for ph, _, s, v in ring.ring_schedule(r, n)] for r in range(n)]
    grids = {"ring (05)": ring05, "dbt (07)": [sched.canonical(zoo.schedule("dbt", r, n, count, 2)) for r in range(n)]}
    plot.schedule_png(tmp_path / "s.png", grids, count, "t")
    assert_drawn(tmp_path / "s.png", colours=8)  # grey, white, four ranks' colours, their hatched tints


def test_a_picture_that_cannot_be_written_is_said_before_the_work(tmp_path, monkeypatch):
    assert plot.cannot_write(str(tmp_path / "x.png")) is None
    assert "no such folder" in plot.cannot_write(str(tmp_path / "nowhere" / "x.png"))
    monkeypatch.setattr(plot.importlib.util, "find_spec", lambda name: None)
    assert "pip install matplotlib" in plot.cannot_write(str(tmp_path / "x.png"))


@pytest.mark.parametrize("lesson, args", [
    ("05_ring_allreduce.py", ["-b", "1K", "-e", "4K", "-f", "4"]),
    ("07_allreduce_algorithms.py", ["--algos", "ring,rd", "-b", "4K", "-e", "16K", "-f", "4"])])
def test_a_run_writes_both_pictures(lesson, args, tmp_path):
    mpiexec = mpi_launchers.mpiexec(2)  # as the runner finds it, with what it needs (Open MPI as root: a flag)
    out = tmp_path / "r.json"
    cmd = mpiexec + ["-n", "2", sys.executable, "-m", "mpi4py", os.path.join(ROOT, "lessons", lesson),
                     *args, "-n", "1", "-w", "0", "--counts", "5", "--plot", str(tmp_path / "plot.png"),
                     "--trace-png", str(tmp_path / "trace.png"), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"wrote {tmp_path / 'plot.png'}" in proc.stdout and f"wrote {tmp_path / 'trace.png'}" in proc.stdout
    assert_drawn(tmp_path / "plot.png", (700, 400) if lesson.startswith("05") else (750, 450))
    assert_drawn(tmp_path / "trace.png", colours=6)
    assert json.loads(out.read_text())["ranks"][0]["comm"], "every rank's counts are in the JSON"
    if lesson.startswith("07"):
        return  # a bad path is refused by the same plot.cannot_write in both lessons: once is enough
    bad = subprocess.run(cmd[:-6] + ["--plot", str(tmp_path / "nowhere" / "p.png")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    said = bad.stderr.split("-" * 20)[0].strip().splitlines()  # Open MPI's banner follows, between rules
    assert bad.returncode == 2 and "no such folder" in bad.stderr and len(said) == 1, bad.stderr


def drawn_figure(monkeypatch, draw):
    """The figure a plot function made, kept open (its _save still writes the file)."""
    kept = []
    monkeypatch.setattr(plot, "_save", lambda plt, fig, path: (kept.append(fig), fig.savefig(path, dpi=plot.DPI),
                                                               f"wrote {path}")[-1])
    draw()
    assert kept, "the function saved no figure"
    return kept[0]


def test_busbw_has_a_log_y_axis_so_small_sizes_are_not_flattened_to_zero(tmp_path, monkeypatch):
    sizes = [8 * 4 ** k for k in range(10)]
    fig = drawn_figure(monkeypatch, lambda: plot.busbw_png(tmp_path / "b.png", sizes,
                                                           {"ring": [1e-6 * 4 ** k for k in range(10)],
                                                            "lib": [0.0] + [2e-6 * 4 ** k for k in range(1, 10)]}, "t"))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    low, high = ax.get_ylim()
    assert low <= 1e-6 and high >= 1e-6 * 4 ** 9  # the smallest size's busbw is on the axis, not at its foot
    assert_drawn(tmp_path / "b.png", (700, 400))


def test_the_phases_are_named_from_what_the_schedule_does():
    n, count = 4, 7
    bounds = shards.chunk_bounds(count, n)
    ring05 = [[([(*bounds[s], (r + 1) % n)], [(*bounds[v], (r - 1) % n, "add" if ph == "reduce-scatter" else "copy")])
               for ph, _, s, v in ring.ring_schedule(r, n)] for r in range(n)]
    assert plot.phases(ring05) == [(0, 2, "reduce-scatter"), (3, 5, "all-gather")]
    named = {algo: [kind for *_, kind in plot.phases([sched.canonical(zoo.schedule(algo, r, n, count, 2))
                                                      for r in range(n)])]
             for algo in ("rd", "rabenseifner", "tree")}
    assert named == {"rd": ["all-reduce"], "rabenseifner": ["reduce-scatter", "all-gather"],
                     "tree": ["reduce", "broadcast"]}


def test_the_schedule_picture_has_no_overlapping_words(tmp_path, monkeypatch):
    """A learner reads it without the lesson: no label covers another, none runs off the canvas."""
    n, count = 4, 7
    bounds = shards.chunk_bounds(count, n)
    ring05 = [[([(*bounds[s], (r + 1) % n)], [(*bounds[v], (r - 1) % n, "add" if ph == "reduce-scatter" else "copy")])
               for ph, _, s, v in ring.ring_schedule(r, n)] for r in range(n)]
    grids = {"ring (05)": ring05,
             "tree (07)": [sched.canonical(zoo.schedule("tree", r, n, count, 2)) for r in range(n)]}
    fig = drawn_figure(monkeypatch, lambda: plot.schedule_png(tmp_path / "s.png", grids, count, "a title"))
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.findobj(lambda a: hasattr(a, "get_text"))
             if a_visible_text(t)]
    legend = fig.legends[0].get_window_extent(renderer)
    canvas = fig.bbox
    for i, a in enumerate(boxes):
        assert canvas.x0 <= a.x0 and a.x1 <= canvas.x1 and canvas.y0 <= a.y0 and a.y1 <= canvas.y1
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), f"{a} overlaps {b}"
    for ax in fig.axes:  # and no word sits on a slice: the bars stay readable
        bars = [p.get_window_extent(renderer) for p in ax.patches if p.get_facecolor()[:3] != (0.92, 0.92, 0.92)]
        for t in ax.texts:
            box = t.get_window_extent(renderer)
            assert not any(box.overlaps(bar) for bar in bars), f"{t.get_text()!r} covers a slice"
    words = [t for t in fig.texts if t.get_text() == "a title"]
    assert words and not words[0].get_window_extent(renderer).overlaps(legend)  # the legend is off the title


def a_visible_text(t):
    from matplotlib.text import Text
    return isinstance(t, Text) and t.get_visible() and bool(t.get_text().strip())
