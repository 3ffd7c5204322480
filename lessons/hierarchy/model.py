"""Lesson 15's prediction on real nodes: an alpha-beta model of the flat ring and of two levels, from a
calibration of this run's own links, to set beside the race's measured ratio.

A step of a ring takes alpha + (bytes through its busiest link) x beta, every rank sending at once:
  * inside a node each rank sends one chunk to its neighbour (alpha_in, beta_in: one pair);
  * across nodes the link into a node carries every chunk bound for it (alpha_x, beta_x: per byte of
    that link), K of them in two levels' step across (one per local rank), and in the flat ring as
    many as the ring's edges that enter the node (1 when ranks are placed in blocks).
  flat ring:  2(N-1) steps of C/N, each the slower of its chunk inside and its edges across;
  two levels: 2(K-1) steps of C/K inside, then 2(M-1) steps of K x C/(KM) across.
Reductions (additions) and copies are left out: on a slow link they are small beside it.
"""
from common import bandwidth, buffers

SMALL, BIG = 8, 1 << 20     # calibration messages, bytes: alpha from the small one, beta from the big
ITERS = {SMALL: 20, BIG: 4}


def edges_in(places, n):
    """The most flat-ring edges r -> r+1 that enter one node from another (places[r] = (node, local))."""
    into = {}
    for r in range(n):
        src, dst = places[r][0], places[(r + 1) % n][0]
        if src != dst:
            into[dst] = into.get(dst, 0) + 1
    return max(into.values(), default=0)


def calibrate(ctx, raw, lay):
    """{'in': (alpha, beta), 'x': (alpha, beta)} in seconds and seconds per byte: each rank exchanges a
    message with its ring neighbour inside its node (raw[0]), then with its local rank on the next
    node (raw[1]): all ranks at once, so the link into a node carries K messages. Collective."""
    k, m, node_id, local = lay["k"], lay["m"], lay["node_id"], lay["local_rank"]
    legs = {"in": (raw[0], (local + 1) % k, (local - 1) % k, 1) if k > 1 else None,
            "x": (raw[1], (node_id + 1) % m, (node_id - 1) % m, k)}
    out = {}
    for name, leg in legs.items():
        if leg is None:
            out[name] = (0.0, 0.0)
            continue
        be, dest, source, streams = leg
        t = {}
        for size in (SMALL, BIG):
            send, recv = buffers.empty(ctx, size, "uint8"), buffers.empty(ctx, size, "uint8")
            t[size] = bandwidth.time_op(ctx.comm, lambda: be.exchange(send, recv, dest, source), 2,
                                        ITERS[size], be.sync)
        beta = max(t[BIG] - t[SMALL], 0.0) / (streams * (BIG - SMALL))
        out[name] = (max(t[SMALL] - streams * SMALL * beta, 0.0), beta)
    return out


def predict(cal, lay, n, nbytes):
    """(flat ring seconds, two levels seconds) for an all-reduce of nbytes, from calibrate()'s dict."""
    k, m = lay["k"], lay["m"]
    (a_in, b_in), (a_x, b_x) = cal["in"], cal["x"]
    chunk = nbytes / n
    e = edges_in(lay["places"], n)
    step = max(a_x + e * chunk * b_x if e else 0.0, a_in + chunk * b_in if e < k else 0.0)
    flat = 2 * (n - 1) * step
    two = 2 * (k - 1) * (a_in + nbytes / k * b_in) + 2 * (m - 1) * (a_x + k * nbytes / (k * m) * b_x)
    return flat, two


def table(rows, cal, lay, n):
    """[(size, measured flat / two levels, predicted)] for each size the race ran."""
    by = {}
    for r in rows:
        by.setdefault(r["size"], {})[r["algo"]] = r["time_us"]
    out = []
    for size, t in sorted(by.items()):
        flat, two = predict(cal, lay, n, size)
        out.append((size, t["flat ring"] / t["two levels"] if t["two levels"] else 0.0, flat / two if two else 0.0))
    return out
