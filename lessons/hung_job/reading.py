"""Lesson 14's faults planted on paper: what a faulty run's records hold, without running it, and your
first_divergence graded on them.

    Call(seq, op, dtype, count, root, comm, site)   one world collective as the recorder kept it
    calls(entries)                                  a rank's recorded entries as its world Calls, in order
    planted(template, world, R, fault, k, also)     every rank made `template`'s calls; R (and the ranks
                                                    `also`) have the fault at #k
    grade(first_divergence, entries, np, planted_seq)   the clean run and each fault, read by yours

A plant changes what the real fault changes (compare a real run's rankR.flight files):
  skip            R's #k is its next call (from that call's line): the numbers after it shift by one
  op/count/dtype  R's #k comes from the fault's own line of the page, a site no other call has
  root            the same line, another root
A hang ends every rank's record at #k, the call each rank waits in (skip, op, count, dtype hung or
failed there on both APIs); the root fault's records go on to the end, as when MPICH's broadcast
finished with the right values by luck. Each fault is planted on each of 2 ranks (no majority: the
program's order breaks the tie), on ranks 1 and 3 of 4 (two leave the majority alike; the lower is
the answer) and on rank 0, a middle rank and the last of np, so "the first rank that differs from
rank 0" is graded too.
The answer key is the fault planted (its rank, #k and field), not a second reading of the records.
"""
from collections import namedtuple

Call = namedtuple("Call", "seq op dtype count root comm site")  # site: file:line of the call
ON_PAPER = ("skip", "op", "count", "dtype", "root")  # the faults a reading of world collectives sees
HANGS = ("skip", "op", "count", "dtype")  # their records end at #k; root's run goes on


def calls(entries):
    """This rank's world collectives from its flight record (common/flight.py's entries), as Calls."""
    return [Call(e["seq"], e["op"], e["dtype"], e["count"], e["root"], e["comm"], e["site"])
            for e in entries if e["kind"] == "coll" and e["comm"] == "world"]


def fresh_site(template, site):
    """A line of site's file that no call of template was made from: where a fault's own call sits."""
    path, _, line = site.rpartition(":")
    taken = {call.site for call in template}
    return next(f"{path}:{n}" for n in range(int(line) - 1, -len(taken) - 2, -1) if f"{path}:{n}" not in taken)


def planted(template, world, R, fault, k, also=()):
    """{rank: [Call, ...]} for `world` ranks that made `template`'s calls (one rank's), with one fault
    on rank R (and the same on the ranks `also`) at #k as --fault plants it (module docstring): a hang's
    records end at #k."""
    mine = []
    for call in template:
        if fault == "skip" and call.seq >= k:
            if call.seq > k:  # R makes its next calls; each takes the number one lower
                mine.append(call._replace(seq=call.seq - 1))
            continue
        if call.seq == k:
            moved = fresh_site(template, call.site)
            call = {"op": call._replace(op="all_gather", count=call.count * world, site=moved),
                    "count": call._replace(count=call.count // 2, site=moved),
                    "dtype": call._replace(dtype="float64", site=moved),
                    "root": call._replace(root=1)}.get(fault, call)
        mine.append(call)
    others = list(template)
    if fault in HANGS:  # every rank waits in its #k: nothing after it was recorded
        mine, others = [c for c in mine if c.seq <= k], [c for c in others if c.seq <= k]
    return {rank: (list(mine) if rank == R or rank in also else list(others)) for rank in range(world)}


def fault_ranks(world):
    """Where each fault is planted on paper: rank 0, a middle rank and the last, in that order."""
    return sorted({0, world // 2, world - 1})


def grade(first_divergence, entries, np, planted_seq):
    """Your first_divergence on the clean run's records and on each fault planted in them: on each of
    2 ranks, on ranks 1 and 3 of 4 at once, on each of fault_ranks(np). ('none' or what yours said of
    a clean run, [{fault, world, planted_on, also, want_*, rank, seq, field}, ...]): rank 0's cases
    first, the last rank's of np last."""
    template = calls(entries)
    plants = [(2, R, ()) for R in (0, 1)] + [(4, 1, (3,))] + [(np, R, ()) for R in fault_ranks(np)]
    cleans = [first_divergence({rank: list(template) for rank in range(world)}) for world in sorted({2, 4, np})]
    cases = []
    for world, R, also in plants:
        for fault in ON_PAPER:
            k = planted_seq(fault)
            got = first_divergence(planted(template, world, R, fault, k, also)) or (None, None, None)
            cases.append({"fault": fault, "world": world, "planted_on": R, "also": list(also), "want_rank": R,
                          "want_seq": k, "want_field": fault, "rank": got[0], "seq": got[1], "field": got[2]})
    clean = next((said for said in cleans if said is not None), None)
    return ("none" if clean is None else list(clean)), cases
