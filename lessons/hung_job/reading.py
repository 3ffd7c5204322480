"""Lesson 14's faults planted on paper: what a hung run's records would hold, without the hang, and
your first_divergence graded on them.

    Call(seq, op, dtype, count, root, comm, site)   one world collective as the recorder kept it
    calls(entries)                                  a rank's recorded entries as its world Calls, in order
    planted(template, world, R, fault, k)           every rank made `template`'s calls; R has the fault at #k
    grade(first_divergence, entries, world, R, planted_seq)   the clean run and each fault, read by yours

The answer key is the fault planted (its rank, #k and field), not a second reading of the records.
"""
from collections import namedtuple

Call = namedtuple("Call", "seq op dtype count root comm site")  # site: file:line of the call
ON_PAPER = ("skip", "op", "count", "dtype", "root")  # the faults a reading of world collectives sees


def calls(entries):
    """This rank's world collectives from its flight record (common/flight.py's entries), as Calls."""
    return [Call(e["seq"], e["op"], e["dtype"], e["count"], e["root"], e["comm"], e["site"])
            for e in entries if e["kind"] == "coll" and e["comm"] == "world"]


def planted(template, world, R, fault, k):
    """{rank: [Call, ...]} for `world` ranks that made `template`'s calls (one rank's), with one fault
    on rank R at #k as --fault plants it: skipped, or another op, count, dtype or root there."""
    mine = []
    for call in template:
        if call.seq == k and fault == "skip":
            continue
        if call.seq > k and fault == "skip":
            call = call._replace(seq=call.seq - 1)  # the skipped call's number goes to the next one
        elif call.seq == k:
            call = {"op": call._replace(op="all_gather", count=call.count * world),
                    "count": call._replace(count=call.count // 2),
                    "dtype": call._replace(dtype="float64"),
                    "root": call._replace(root=1)}.get(fault, call)
        mine.append(call)
    return {rank: (mine if rank == R else list(template)) for rank in range(world)}


def grade(first_divergence, entries, world, R, planted_seq):
    """Your first_divergence on the clean run's records and on each fault planted in them, on rank R:
    ('none' or what yours said of the clean run, [{fault, want_*, rank, seq, field}, ...])."""
    template = calls(entries)
    clean = first_divergence({rank: list(template) for rank in range(world)})
    cases = []
    for fault in ON_PAPER:
        k = planted_seq(fault)
        got = first_divergence(planted(template, world, R, fault, k)) or (None, None, None)
        cases.append({"fault": fault, "want_rank": R, "want_seq": k, "want_field": fault,
                      "rank": got[0], "seq": got[1], "field": got[2]})
    return ("none" if clean is None else list(clean)), cases
