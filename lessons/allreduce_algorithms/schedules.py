"""Lesson 07's schedules, and the one executor that runs any of them.

A schedule is, for rank r of N ranks and a buffer of `count` elements, a list of rounds; a round is
(sends, recvs): sends [(lo, hi, peer)], recvs [(lo, hi, peer, "add" | "copy")], slices of the buffer.
Every rank gets the same number of rounds (some empty), so the ranks stay in step.

    fold(n), to_virtual, to_real, pre_post      the non-power-of-two fold that rd and Rabenseifner share
    rd_schedule, ring_schedule, tree_schedule   (Rabenseifner's is the lesson's exercise, in the lesson)
    dbt_trees(n), dbt_schedule(rank, n, count, k)   NCCL's double binary tree, pipelined in k chunks
    mismatch(every rank's schedule)             None, or the first send that meets no matching receive
    Plan(ctx, rounds, buf, dtype).run(be)       runs one rank's schedule on a common/p2p.py backend

Pure functions of (rank, n, count) except Plan, which talks.
"""
from common import buffers, shards


def fold(n):
    """(N', r): the largest power of two <= n, and how many ranks the pre step folds away."""
    p2 = 1 << (n.bit_length() - 1)
    return p2, n - p2


def to_virtual(rank, r):
    """Rank in the power-of-two core, or None for an even rank < 2r that sits out."""
    if rank < 2 * r:
        return None if rank % 2 == 0 else rank // 2
    return rank - r


def to_real(v, r):
    return 2 * v + 1 if v < r else v + r


def pre_post(rank, n, count, core):
    """Wrap the core rounds with the non-power-of-two pre and post steps (none when n is a power of 2).
    N' = 2^floor(lg N), r = N - N'. Pre step: among the first 2r ranks, even ranks send their buffer to
    rank+1 and sit out; post step: rank+1 sends the result back (rd and Rabenseifner share this)."""
    p2, r = fold(n)
    if r == 0:
        return core
    pre, post = ([], []), ([], [])
    if rank < 2 * r and rank % 2 == 0:  # sits out: hands its data over, gets the result back
        pre[0].append((0, count, rank + 1))
        post[1].append((0, count, rank + 1, "copy"))
    elif rank < 2 * r:
        pre[1].append((0, count, rank - 1, "add"))
        post[0].append((0, count, rank - 1))
    return [pre] + core + [post]


def rd_schedule(rank, n, count):
    """Recursive doubling: lg N rounds, partner = rank XOR mask, the whole buffer each round (folded
    to N' ranks first when N is not a power of two)."""
    p2, r = fold(n)
    v = to_virtual(rank, r)
    core = []
    mask = 1
    while mask < p2:
        rnd = ([], [])
        if v is not None:
            peer = to_real(v ^ mask, r)
            rnd = ([(0, count, peer)], [(0, count, peer, "add")])
        core.append(rnd)
        mask <<= 1
    return pre_post(rank, n, count, core)


def ring_schedule(rank, n, count):
    """Reduce-scatter + all-gather over neighbours (lesson 05's ring): 2(N-1) rounds, each rank
    sends 2(N-1)/N of the buffer in all."""
    bounds = shards.chunk_bounds(count, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    rounds = []
    for s in range(n - 1):  # reduce-scatter
        rounds.append(([(*bounds[(rank - s) % n], right)], [(*bounds[(rank - s - 1) % n], left, "add")]))
    for s in range(n - 1):  # all-gather: rank r finished chunk r+1
        rounds.append(([(*bounds[(rank + 1 - s) % n], right)], [(*bounds[(rank - s) % n], left, "copy")]))
    return rounds


def tree_schedule(rank, n, count):
    """Binomial reduce to rank 0, then binomial broadcast: 2*ceil(lg N) rounds of the WHOLE buffer; the
    root receives ceil(lg N) buffers and sends ceil(lg N) (a parameter server, a star, would receive
    N-1 and send N-1: the tree spreads that over lg N levels)."""
    masks = [1 << i for i in range(max(n - 1, 0).bit_length())]  # 1, 2, 4, ... < n: ceil(lg n) rounds
    low = rank & -rank if rank else 1 << 30  # rank's lowest set bit: its parent is rank - low
    rounds = []
    for m in masks:  # reduce towards rank 0
        if low == m:
            rounds.append(([(0, count, rank - m)], []))
        elif low > m and rank + m < n:
            rounds.append(([], [(0, count, rank + m, "add")]))
        else:
            rounds.append(([], []))
    for m in reversed(masks):  # broadcast from rank 0, the same edges backwards
        if low == m:
            rounds.append(([], [(0, count, rank - m, "copy")]))
        elif low > m and rank + m < n:
            rounds.append(([(0, count, rank + m)], []))
        else:
            rounds.append(([], []))
    return rounds


def btree(n, rank):
    """(parent, [children]) in NCCL's binary tree over 0..n-1: odd ranks are leaves, root 0."""
    if rank == 0:
        bit = 1
        while bit < n:
            bit <<= 1
        return -1, ([bit >> 1] if n > 1 else [])
    low = rank & -rank
    up = rank ^ low | low << 1
    if up >= n:
        up = rank ^ low
    kids, half = [], low >> 1
    if half:
        kids.append(rank - half)
        while half and rank + half >= n:  # the right child may be out of range: take a smaller step
            half >>= 1
        if half:
            kids.append(rank + half)
    return up, kids


def dbt_trees(n):
    """Two trees as {rank: (parent, children)}: the second is the first mirrored (n even) or shifted by
    one (n odd), so a rank inner in one tree is mostly a leaf in the other."""
    first = {r: btree(n, r) for r in range(n)}
    if n % 2 == 0:
        f = lambda x: n - 1 - x  # noqa: E731  mirror, its own inverse
        g = f
    else:
        f = lambda x: (x + 1) % n  # noqa: E731  shift
        g = lambda x: (x - 1) % n  # noqa: E731
    second = {}
    for r in range(n):
        up, kids = first[g(r)]
        second[r] = (-1 if up < 0 else f(up), [f(k) for k in kids])
    return [first, second]


def depths(tree):
    out = {}
    for r in tree:
        d, x = 0, r
        while tree[x][0] >= 0:
            x, d = tree[x][0], d + 1
        out[r] = d
    return out


def dbt_depth(n):
    return max(max(depths(t).values()) for t in dbt_trees(n))


def dbt_schedule(rank, n, count, k):
    """NCCL's double binary tree: two binary trees, the second the first mirrored (N even) or shifted
    by one (N odd), so a rank inner in one is a leaf in the other. Each tree all-reduces one half in k
    chunks, reduce up and broadcast down overlapped: chunk c goes up from depth d at round c + D - d and
    comes down from depth d at round c + D + d; k + 2D - 1 rounds in all (D = the trees' depth)."""
    if n == 1:
        return []
    trees, D = dbt_trees(n), dbt_depth(n)
    rounds = [([], []) for _ in range(k + 2 * D - 1)]
    for t, (hlo, hhi) in enumerate(shards.chunk_bounds(count, 2)):
        tree, dep = trees[t], depths(trees[t])
        parent, kids = tree[rank]
        d = dep[rank]
        chunks = [(hlo + a, hlo + b) for a, b in shards.chunk_bounds(hhi - hlo, k)]
        for tick, (sends, recvs) in enumerate(rounds):
            c = tick - (D - d)  # reduce: my chunk c goes up once my children's chunk c has arrived
            if parent >= 0 and 0 <= c < k:
                sends.append((*chunks[c], parent))
            c = tick - (D - d - 1)
            for kid in kids:
                if 0 <= c < k:
                    recvs.append((*chunks[c], kid, "add"))
            c = tick - D - d  # broadcast: the finished chunk c goes down
            for kid in kids:
                if 0 <= c < k:
                    sends.append((*chunks[c], kid))
            c = tick - D - d + 1
            if parent >= 0 and 0 <= c < k:
                recvs.append((*chunks[c], parent, "copy"))
    return rounds


def canonical(rounds):
    """Sends and receives in offset order: two messages to the same peer in one round match in the
    order they are posted (MPI per source, NCCL has no tags), so both sides must post alike."""
    return [(sorted(s, key=lambda m: m[:2]), sorted(r, key=lambda m: m[:2])) for s, r in rounds]


def mismatch(per_rank):
    """None if every non-empty send meets a receive of the same slice on its peer in the same round
    (in posting order), else the first problem in words. Pure, so every rank finds the same answer
    and all can stop together: a schedule that does not match would otherwise hang or truncate."""
    n = len(per_rank)
    if len({len(s) for s in per_rank}) > 1:
        return f"the ranks run different numbers of rounds: {[len(s) for s in per_rank]}"
    for i, rnd in enumerate(zip(*per_rank)):
        pairs = set()
        for q, (sends, recvs) in enumerate(rnd):
            pairs |= {(q, p) for _, _, p in sends} | {(p, q) for _, _, p, _ in recvs}
        for src, dst in sorted(pairs):
            if not (0 <= src < n and 0 <= dst < n):
                return f"round {i}: a message between ranks {src} and {dst}, but there are {n} ranks"
            out = [m[:2] for m in rnd[src][0] if m[2] == dst and m[1] > m[0]]
            got = [m[:2] for m in rnd[dst][1] if m[2] == src and m[1] > m[0]]
            if out != got:
                return f"round {i}: rank {src} sends slices {out} to rank {dst}, which expects {got}"
    return None


def copy_into(dst, src):
    if hasattr(dst, "copy_"):
        dst.copy_(src)  # torch
    else:
        dst[...] = src  # numpy, cupy


class Plan:
    """A schedule bound to one buffer: views made once, so a timed call only talks and adds."""

    def __init__(self, ctx, rounds, buf, dtype):
        self.buf, self.rounds = buf, []
        rounds = canonical(rounds)
        need = max([sum(hi - lo for lo, hi, _, _ in self._via_scratch(s, rv)) for s, rv in rounds] + [0])
        scratch = buffers.empty(ctx, need, dtype)
        for sends, recvs in rounds:
            via = self._via_scratch(sends, recvs)
            out = [(buf[lo:hi], peer) for lo, hi, peer in sends]
            into, after, pos = [], [], 0
            for m in recvs:
                lo, hi, peer, op = m
                if m in via:  # adds always, copies only where they overlap a send of this round
                    tmp = scratch[pos:pos + hi - lo]
                    pos += hi - lo
                    into.append((tmp, peer))
                    after.append((buf[lo:hi], tmp, op == "add"))
                else:
                    into.append((buf[lo:hi], peer))
            self.rounds.append((out, into, after, (sends, recvs)))

    @staticmethod
    def _via_scratch(sends, recvs):
        return [m for m in recvs if m[3] == "add" or any(m[0] < b and a < m[1] for a, b, _ in sends)]

    def run(self, be, trace=None):
        """One all-reduce, in place. be: a common/p2p.py backend (or counting.Counted around one: each
        round that talks is one exchange or group call). trace: a list that gets each round's
        (sends, recvs) as run."""
        for out, into, after, raw in self.rounds:
            if len(out) <= 1 and len(into) <= 1 and (out or into):  # one each way: the cheaper call
                be.exchange(out[0][0] if out else None, into[0][0] if into else None,
                            out[0][1] if out else 0, into[0][1] if into else 0)
            elif out or into:
                be.group(out, into)  # every message of the round in flight at once, then wait
            for dst, src, add in after:
                if add:
                    dst += src  # the reduction: gamma per byte
                else:
                    copy_into(dst, src)
            if trace is not None:
                trace.append(raw)


def checked_plan(ctx, every, buf, dtype, said):
    """This rank's Plan, once every rank's schedule (every[q], rank q's) is known to match. Every rank
    finds the same problem (mismatch is pure), so every rank stops on the same self-check error, `said`
    and the problem, before anything hangs."""
    every = [canonical(rounds) for rounds in every]
    problem = mismatch(every)
    if problem:
        raise RuntimeError(f"{said}: {problem}")
    return Plan(ctx, every[ctx.rank], buf, dtype)
