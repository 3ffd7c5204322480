"""The fixed binary tree over the world's M contributions, numbered 0 .. M-1 whatever the split.

A node covers contributions lo .. hi-1; it splits at lo + P, P the largest power of two below hi - lo,
so every left child is a whole, aligned power-of-two block and the depth is ceil(log2 M). The tree is
a function of M alone: how many ranks there are, and which rank holds which contributions, never
changes which two partial sums are added.

    tree.split(lo, hi)               # where node [lo, hi) splits
    tree.owned(m, lo, hi)            # the largest nodes lying wholly inside one rank's block [lo, hi)
    tree.one_process(values)         # the whole tree summed here: what every split must reproduce
"""


def split(lo, hi):
    p = 1
    while 2 * p < hi - lo:
        p *= 2
    return lo + p


def owned(m, lo, hi):
    """The nodes of the tree over 0..m-1 that lie wholly inside [lo, hi) and whose parent does not:
    left to right. Over all ranks' blocks they cover 0..m-1 once, and every node above them straddles
    two blocks."""
    out = []

    def walk(a, b):
        if b <= lo or a >= hi:
            return
        if lo <= a and b <= hi:
            out.append((a, b))
            return
        mid = split(a, b)
        walk(a, mid)
        walk(mid, b)
    if m:
        walk(0, m)
    return out


def node_sum(values, a, b):
    """Node [a, b) of the tree, from the contributions themselves (values[j] is contribution j)."""
    if b - a == 1:
        return values[a].copy()
    mid = split(a, b)
    return node_sum(values, a, mid) + node_sum(values, mid, b)


def one_process(values):
    return node_sum(values, 0, len(values))


def finish(known, m):
    """The root's sum from `known` ({(lo, hi): node sum}, a cover of 0..m-1 by nodes of the tree): every
    node not known is its two children added, left + right, as node_sum adds them."""
    def up(a, b):
        if (a, b) in known:
            return known[(a, b)]
        mid = split(a, b)
        return up(a, mid) + up(mid, b)
    return up(0, m)
