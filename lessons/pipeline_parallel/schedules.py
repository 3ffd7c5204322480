"""Lesson 12's schedules as pure functions: from each stage's order of ops to a rank x tick grid and
the messages every tick carries, checked before anything runs.

An op is ("F", i), the forward of micro-batch i on a stage, or ("B", i), its backward. orders[s] is
stage s's ops in the order it runs them (the lesson writes GPipe's and 1F1B's). Then:

    check_orders(orders, m)     None, or the first stage that does not run F0..F(m-1), B0..B(m-1) once each
    place(orders, cost)         {(stage, op): start tick}: each op at the earliest tick its inputs allow;
                                ScheduleError naming who waits for what when the orders deadlock
    grid(orders, start, cost)   [stage][tick] -> the op running then, or None (idle)
    messages(orders, start)     [stage][tick] -> {"forward": (sends, recvs), "backward": (sends, recvs)}
    mismatch(steps)             None, or the first send that meets no receive (or leaves too early)
    plan(orders, m)             all of the above, checked: a Plan(ticks, grid, steps, start)
    render(grid, width)         the grid as text lines, in blocks of ticks that fit `width` columns
    bubble(grid)                [stage] -> idle ticks / all ticks

Inputs: F(i) on stage s needs F(i) on s-1 (its activation); B(i) on s needs F(i) on s (the stashed
activations) and B(i) on s+1 (the gradient of its output). A message is delivered in the tick its
consumer runs (before the op): the activation of F(i) travels when s+1 runs F(i), the gradient of
B(i) when s-1 runs B(i). Pure functions of the orders: every rank computes every stage's, so all
ranks find the same problem and stop together instead of hanging.
"""
UNIT = {"F": 1, "B": 1}  # ticks an op takes: one each in the lesson (the bubble's fraction is the same
# with B = 2, as tests/test_12_pipeline_parallel.py shows)
KIND = {"F": "forward", "B": "backward"}


class ScheduleError(RuntimeError):
    pass


def name(op):
    return f"{op[0]}{op[1]}"


def check_orders(orders, m):
    """None if every stage runs F0..F(m-1) and B0..B(m-1) exactly once each, else the first problem."""
    want = {(k, i) for k in "FB" for i in range(m)}
    for s, order in enumerate(orders):
        seen = {}
        for op in map(tuple, order):
            seen[op] = seen.get(op, 0) + 1
        stray = [op for op in seen if op not in want]
        twice = [op for op in seen if seen[op] > 1]
        never = sorted(want - set(seen), key=lambda op: (op[0] != "F", op[1]))
        if stray:
            return f"stage {s}'s order runs {name(stray[0])}, not an op of {m} micro-batches"
        if twice:
            return f"stage {s}'s order runs {name(twice[0])} {seen[twice[0]]} times"
        if never:
            more = f" (+{len(never) - 4} more)" if len(never) > 4 else ""
            return f"stage {s}'s order never runs {', '.join(name(op) for op in never[:4])}{more}"
    return None


def needs(s, op, p):
    """The (stage, op) pairs op on stage s waits for."""
    kind, i = op
    if kind == "F":
        return [(s - 1, ("F", i))] if s > 0 else []
    return [(s, ("F", i))] + ([(s + 1, ("B", i))] if s < p - 1 else [])


def place(orders, cost=UNIT):
    """{(stage, op): start tick}: every stage runs its ops in its order, each at the earliest tick
    its own previous op and its inputs allow. ScheduleError when no stage can go on (a deadlock)."""
    p = len(orders)
    start, end, free, pos = {}, {}, [0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                op = tuple(orders[s][pos[s]])
                deps = needs(s, op, p)
                if not all(d in end for d in deps):
                    break
                start[(s, op)] = max([free[s]] + [end[d] for d in deps])
                end[(s, op)] = free[s] = start[(s, op)] + cost[op[0]]
                pos[s] += 1
                moved = True
    stuck = [s for s in range(p) if pos[s] < len(orders[s])]
    if stuck:
        said = {}
        for s in stuck:
            op = tuple(orders[s][pos[s]])
            missing = [(q, o) for q, o in needs(s, op, p) if (q, o) not in end]
            own = [o for q, o in missing if q == s]  # waits for itself: the root of the deadlock
            why = (f"{name(own[0])} on stage {s}, its own, later in its order" if own else
                   " and ".join(f"{name(o)} on stage {q}" for q, o in missing))
            said[s] = (not own, f"stage {s} waits to run {name(op)}, which needs {why}")
        first = sorted(said, key=lambda s: said[s][0])[:2]  # a stage stuck on itself first
        raise ScheduleError("the orders deadlock: " + "; ".join(said[s][1] for s in first)
                            + (f" ({len(stuck)} stages stuck)" if len(stuck) > len(first) else ""))
    return start


def ticks_of(start, cost=UNIT):
    return max([t + cost[op[0]] for (_, op), t in start.items()], default=0)


def grid(orders, start, cost=UNIT):
    """[stage][tick] -> the op that stage runs in that tick, or None: the picture of the schedule."""
    total = ticks_of(start, cost)
    rows = [[None] * total for _ in orders]
    for s, order in enumerate(orders):
        for op in order:
            t = start[(s, tuple(op))]
            for k in range(cost[op[0]]):
                rows[s][t + k] = tuple(op)
    return rows


def messages(orders, start, cost=UNIT):
    """[stage][tick] -> {"forward": (sends, recvs), "backward": (sends, recvs)}, sends [(i, to)],
    recvs [(i, from)]: each stage's side, read from its own ops. A stage sends what its op made to the
    neighbour that consumes it, in the tick the neighbour runs that op; it receives what its own op
    needs in the tick it runs it."""
    p = len(orders)
    steps = [[{"forward": ([], []), "backward": ([], [])} for _ in range(ticks_of(start, cost))]
             for _ in orders]
    for s, order in enumerate(orders):
        for op in order:
            kind, i = op = tuple(op)
            phase = KIND[kind]
            if kind == "F" and s > 0:
                steps[s][start[(s, op)]][phase][1].append((i, s - 1))   # my input, from the left
            if kind == "B" and s < p - 1:
                steps[s][start[(s, op)]][phase][1].append((i, s + 1))   # my output's gradient
            peer = s + 1 if kind == "F" else s - 1                      # who consumes what I make
            if 0 <= peer < p and (peer, op) in start:
                steps[s][start[(peer, op)]][phase][0].append((i, peer))
    return steps


def mismatch(steps, start, cost=UNIT):
    """None if every send meets a receive of the same micro-batch, in the same tick and direction, on
    its peer (and leaves after it is made), else the first problem in words."""
    for t in range(len(steps[0]) if steps else 0):
        for phase in ("forward", "backward"):
            sent = {(s, to, i) for s, st in enumerate(steps) for i, to in st[t][phase][0]}
            got = {(frm, s, i) for s, st in enumerate(steps) for i, frm in st[t][phase][1]}
            what = "activation" if phase == "forward" else "gradient"
            for frm, to, i in sorted(sent ^ got):
                if (frm, to, i) in sent:
                    return (f"tick {t}: stage {frm} sends the {what} of micro-batch {i} to stage {to}, "
                            "which receives no such thing then")
                return (f"tick {t}: stage {to} waits for the {what} of micro-batch {i} from stage {frm}, "
                        "which sends no such thing then")
            for frm, to, i in sorted(sent):
                op = ("F" if phase == "forward" else "B", i)
                made = start[(frm, op)] + cost[op[0]]
                if made > t:
                    return (f"tick {t}: stage {frm} sends the {what} of micro-batch {i}, which it makes "
                            f"only by tick {made}")
    return None


class Plan:
    """A checked schedule: ticks, the grid, each stage's steps (messages per tick), start ticks."""

    def __init__(self, ticks, rows, steps, start):
        self.ticks, self.grid, self.steps, self.start = ticks, rows, steps, start


def plan(orders, m, what="the schedule"):
    """Every stage's order checked, placed, and its messages matched; ScheduleError if anything fails
    (the same on every rank, before any message is posted)."""
    problem = check_orders(orders, m)
    if problem:
        raise ScheduleError(f"{what}: {problem}")
    try:
        start = place(orders)
    except ScheduleError as exc:
        raise ScheduleError(f"{what}: {exc}") from None
    steps = messages(orders, start)
    problem = mismatch(steps, start)
    if problem:
        raise ScheduleError(f"{what} does not match: {problem}")
    return Plan(ticks_of(start), grid(orders, start), steps, start)


def bubble(rows):
    """[stage] -> the fraction of ticks it sits idle."""
    return [sum(op is None for op in row) / len(row) if row else 0.0 for row in rows]


def render(rows, width=100, label="rank"):
    """Text lines: one row per stage, one cell per tick (F3, B3, or . when idle), cut into blocks of
    ticks that each fit `width` columns."""
    ops = [op for row in rows for op in row if op]
    cell = max([len(name(op)) for op in ops] + [2])
    head = len(f"{label} {len(rows) - 1}") + 1
    per_block = max(1, (width - head + 1) // (cell + 1))
    total = len(rows[0]) if rows else 0
    lines = []
    for first in range(0, total, per_block):
        last = min(first + per_block, total)
        if total > per_block:
            lines.append(f"ticks {first}-{last - 1}:")
        for s, row in enumerate(rows):
            cells = " ".join((name(op) if op else ".").ljust(cell) for op in row[first:last])
            lines.append(f"{label} {s}".ljust(head) + cells.rstrip())
    return lines
