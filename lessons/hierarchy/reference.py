"""What lesson 15 is checked against, apart from the code it teaches: where each rank really runs
(groups standing in for nodes on one machine, and the nodes read back from every rank's home), and the
mixture-of-experts routing with its one-process reference (what should reach each rank, and how many
(token, rank) and (token, node) pairs leave a node: the de-duplication factor's two sides).
"""
import argparse
import re

import numpy as np

SEED = 15                 # lesson 15's seed: rank r's tokens come from SEED + 100 + r
TOKENS, DMODEL = 64, 8    # tokens per rank, features per token (float64)
EXPERTS, TOPK = 2, 3      # experts per rank (expert e on world rank e // EXPERTS); experts per token
MOE_SEED = 150            # the router


PLACEMENTS = ("block", "round-robin")
GROUP = re.compile(r"^(\d+)x(\d+):(block|round-robin)$")


def parse_groups(text):
    """--groups: 'MxK:placement,...' -> [(M, K, placement)]; a flag type (one line on bad input)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        hit = GROUP.match(item)
        if not hit or int(hit[1]) < 1 or int(hit[2]) < 1:
            raise argparse.ArgumentTypeError(f"expected MxK:block or MxK:round-robin (M groups of K ranks), "
                                             f"got {item!r}")
        out.append((int(hit[1]), int(hit[2]), hit[3]))
    if not out or len({m * k for m, k, _ in out}) < len(out):
        raise argparse.ArgumentTypeError(f"expected one MxK:placement per world size, got {text!r}")
    return out


def group_for(groups, n):
    """(K, placement) of the --groups entry of N = M x K ranks, or None when none is N ranks."""
    return next(((k, p) for m, k, p in groups or [] if m * k == n), None)


def pretend_node(rank, n, k, placement):
    """The group standing in for a node that a launcher's placement puts world rank `rank` on (N/K
    groups of K ranks): block, or round-robin as Open MPI's --map-by node or Slurm's cyclic
    distribution deal ranks out."""
    return rank // k if placement == "block" else rank % (n // k)


def truth(home):
    """[(node, local)] per world rank from where each rank really runs: nodes in the order of their
    lowest rank, local ranks in rank order. The meter's and the closed forms' view, not the learner's."""
    order = sorted(set(home), key=home.index)
    seen = {}
    out = []
    for h in home:
        out.append((order.index(h), seen.setdefault(h, 0)))
        seen[h] += 1
    return out


def placement_of(places, k, m):
    """'block', 'round-robin' or 'other': how the launcher placed N = M x K ranks, read from truth()."""
    n = len(places)
    if places == [(r // k, r % k) for r in range(n)]:
        return "block"
    return "round-robin" if places == [(r % m, r // m) for r in range(n)] else "other"


def moe_tokens(rank, tokens):
    return np.random.default_rng(SEED + 100 + rank).standard_normal((tokens, DMODEL))


def route(x, n):
    """Top-k: each token's TOPK experts by the router's logits (expert e on world rank e // EXPERTS)."""
    router = np.random.default_rng(MOE_SEED).standard_normal((DMODEL, n * EXPERTS))
    return np.argsort(-(x @ router), axis=1, kind="stable")[:, :TOPK]


def row(x, gid, mask):
    """One token on the wire: its features, its global id and a bit per expert it is bound for."""
    return np.concatenate([x, [gid, mask]])


def delivered(rows):
    """{token id: (features, expert bits)} of what reached this rank; copies of one token are merged."""
    out = {}
    for r in rows:
        gid, feats = int(r[DMODEL]), tuple(r[:DMODEL])
        old = out.get(gid, (feats, 0))
        out[gid] = (feats if old[0] == feats else None, old[1] | int(r[DMODEL + 1]))
    return out


def moe_one_process(ctx, tokens, places):
    """The reference: every rank's tokens and routing in one process. (what reaches me, my tokens'
    pairs with ranks on other nodes, my tokens' pairs with other nodes)."""
    n, me = ctx.world_size, ctx.rank
    want = {}
    for r in range(n):
        x = moe_tokens(r, tokens)
        for t, experts in enumerate(route(x, n)):
            bits = sum(1 << (int(e) % EXPERTS) for e in experts if int(e) // EXPERTS == me)
            if bits:
                want[r * tokens + t] = (tuple(x[t]), bits)
    chosen = route(moe_tokens(me, tokens), n)
    ranks = [{int(e) // EXPERTS for e in ex} - {w for w in range(n) if places[w][0] == places[me][0]}
             for ex in chosen]
    return want, sum(len(s) for s in ranks), sum(len({places[w][0] for w in s}) for s in ranks)
