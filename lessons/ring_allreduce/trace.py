"""Lesson 05's --trace-png: note, step by step, what each rank's ring sent and received, then draw it.

    exchange, after_step = trace.traced(counted.exchange, bounds, grid)   # one count's run, noted
    trace.draw(ctx, path, grid, count)                                    # every rank's steps: one PNG
"""
from common import plot


def traced(exchange, bounds, grid):
    """An exchange and an after_step that note, step by step, the slices this rank sent (to whom) and
    received (from whom; added or copied), as the ring ran them."""
    last = {}

    def send_recv(out, into, dest, source):
        last.update(dest=dest, source=source)
        exchange(out, into, dest, source)

    def after_step(phase, step, send, recv):
        op = "add" if phase == "reduce-scatter" else "copy"
        grid.append(([(*bounds[send], last["dest"])], [(*bounds[recv], last["source"], op)]))
    return send_recv, after_step


def draw(ctx, path, grid, count):
    """--trace-png: every rank's steps, as it ran them, in one picture (ranks down, steps across).
    Collective: every rank hands its grid to rank 0."""
    grids = ctx.comm.gather(grid, root=0)
    if path and ctx.rank == 0:
        print(plot.schedule_png(path, {f"ring all-reduce, count {count}": grids}, count,
                                f"who sends which slice to whom: {ctx.world_size} ranks, api {ctx.api} "
                                f"({ctx.transport})"), flush=True)
