"""Section 5's faults and what a run named: the page trains and compares; this module plants them.

    silent.plants(n, steps)           # the graded plants: rank 0's first, the last rank's last
    silent.apply(values, plant)       # the fault, in place, on this rank's NumPy view of a tensor
    silent.named(seen)                # the first disagreement a run saw -> the JSON's fields
    silent.on_paper(suspects)         # your suspects() at a split no run makes: 2 prints against 2
    silent.hashes(params, fingerprint)  # XOR of words, float32 sum, your fingerprint: flip, swap

A flipped bit and a swap are planted, each in a run of its own. The bit is float32's top mantissa
bit (22): the value moves by a quarter to a half of itself and stays finite; no loss blows up to say
so. The swap keeps every word and moves two: what an order-insensitive hash cannot see. b1[0] and
b1[1] are the first two a float32 sum adds (a0 + a1 = a1 + a0): it misses the swap, bit for bit.
"""
import numpy as np

FLIP = ("w2", 5, 22)      # tensor, element (flat index), bit
SWAP = ("b1", 0, 1)       # tensor and the two elements swapped


def plants(n, steps, rank=None, step=None):
    """A flipped bit and a swap on rank 0 after the first step and on the last rank after the last
    (the edges, where an off-by-one hides); `rank` plants on that rank only (after the middle step
    unless `step` says), `step` after that step."""
    if rank is not None:
        where = [(rank, steps // 2 if step is None else step)]
    else:
        where = [(0, 0 if step is None else step), (n - 1, steps - 1 if step is None else step)]
    out = []
    for r, s in where:
        name, i, bit = FLIP
        out.append({"plant": f"bit {bit} of {name}[{i}] flipped on rank {r} after step {s}",
                    "kind": "flip", "planted_on": r, "tensor": name, "step": s, "elements": [i],
                    "bit": bit})
        name, i, j = SWAP
        out.append({"plant": f"{name}[{i}] and {name}[{j}] swapped on rank {r} after step {s}",
                    "kind": "swap", "planted_on": r, "tensor": name, "step": s, "elements": [i, j],
                    "bit": -1})
    return out


def apply(values, plant):
    """Make the plant's fault in `values`, a float32 NumPy view of the tensor (which changes)."""
    flat = values.reshape(-1)
    assert np.shares_memory(flat, values), "the plant must change the tensor, not a copy"
    if plant["kind"] == "flip":
        flat.view(np.uint32)[plant["elements"][0]] ^= np.uint32(1 << plant["bit"])
        return
    i, j = plant["elements"]
    assert flat[i] != flat[j], "a swap of two equal values changes nothing: plant it elsewhere"
    flat[[i, j]] = flat[[j, i]]


def named(seen):
    """The first disagreement of a run (seen: [(step, tensor, suspects)], in step order) as the
    JSON says it: the one suspect is the rank named; two or more (no strict majority): none, -1."""
    if not seen:
        return {"named_rank": -1, "named_tensor": "none", "named_step": -1, "suspects": [],
                "steps_off": 0}
    step, tensor, ranks = seen[0]
    return {"named_rank": ranks[0] if len(ranks) == 1 else -1, "named_tensor": tensor,
            "named_step": step, "suspects": list(ranks), "steps_off": len(seen)}


def on_paper(suspects):
    """How many suspects suspects() names in a world of 4 made on paper, 2 prints against 2: no
    strict majority, so all 4 (a run plants on one rank at a time and never splits its world so)."""
    got = suspects([{"w1": "a"}, {"w1": "a"}, {"w1": "b"}, {"w1": "b"}], ["w1"])
    return len(got[1]) if got else 0


def xor_words(values):
    """XOR of a float32 tensor's 32-bit words: one flipped bit changes it, no reordering does."""
    words = np.ascontiguousarray(values, np.float32).view(np.uint32).reshape(-1)
    return int(np.bitwise_xor.reduce(words))


def hashes(params, fingerprint):
    """Each kind of plant made on a copy of its tensor (params: {name: float32 NumPy}): the XOR of
    its words, its float32 sum and fingerprint(), before and after: {kind: {what, hash: [b, a]}}."""
    out = {}
    for plant in plants(1, 1, rank=0):
        before = np.array(params[plant["tensor"]], np.float32)
        after = before.copy()
        apply(after, plant)
        out[plant["kind"]] = {
            "what": plant["plant"].split(" on rank")[0],
            "xor": [f"{xor_words(x):08x}" for x in (before, after)],
            "sum": [f"{float(np.sum(x, dtype=np.float32)):.9g}" for x in (before, after)],
            "fingerprint": [str(fingerprint(x)) for x in (before, after)]}
    return out
