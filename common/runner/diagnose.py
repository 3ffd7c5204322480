"""Why a run hung or crashed, from every rank's flight record (common/flight.py): the first divergence.

    snap = flightwatch.read(run_dir)            # {rank: (header, entries)}
    d = diagnose.diagnose(snap, np, moving)     # {"kind", "rank", "ranks", "seq", "comm", "field",
                                                #  "lines"} or None where nothing diverged
Collectives are compared per communicator, call by call (#k = a rank's k-th collective on it): the
first k where the ranks' op, dtype, count or root differ, or where some rank never arrived, is named,
field by field. The call most ranks made at #k is the usual one; at a tie (two ranks, or two groups
alike) the usual one is the call the program made before: the same call after the same line, earlier
in the records. Where nothing breaks the tie the diagnosis says what each rank did and that it cannot
tell which is at fault. A rank whose #k was made at a line the others used for an earlier call skipped
the others' #k. Point-to-point waits that close a cycle are named as a deadlock. A rank outside any
call, or whose record still moved, is slow, not stuck.
"""
import collections
import re

FIELDS = ("op", "dtype", "count", "root")


def waiting(entries):
    """The call a rank waits in: the earliest of its last calls not completed (on a GPU, calls queue
    behind it, each enqueued), or None when its last call completed."""
    found = None
    for e in reversed(entries):
        if e["state"] == "completed":
            break
        found = e
    return found


def stuck(snap, np):
    """True when every rank has a record and is inside a call it started (none computing)."""
    return len(snap) == np and all(e and e[-1]["state"] in ("started", "enqueued") for _, e in snap.values())


def members(comm, np):
    m = re.match(r"group\[([\d,]+)\]$", comm)
    return [int(x) for x in m.group(1).split(",")] if m else list(range(np))


def call(e):
    size = f"{e['dtype']} x {e['count']}" if e["dtype"] else f"{e['count']} items"
    root = f", root {e['root']}" if e["root"] >= 0 else ""
    return f"{e['op']} #{e['seq']} ({size}{root}, {e['comm']})"


def where(entries, moving, rank):
    """What a rank is doing now, in words."""
    if not entries:
        return "made no recorded call"
    last = waiting(entries) or entries[-1]
    if last["state"] == "completed":
        busy = "its record still moves: slow, not stuck" if rank in moving else \
            "computing, slow, or in an unrecorded call"
        return f"is in no recorded call ({busy});\n    its last was {call(last)}"
    what = f"waits in {call(last)}" if last["kind"] == "coll" else \
        f"waits in {last['op']} #{last['seq']} ({last['peers']}, {last['comm']})"
    return what + (" (enqueued: the GPU may still wait in it)" if last["state"] == "enqueued" else "")


def _ranks(rs):
    rs = sorted(rs)
    if len(rs) > 1 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def behind(entries, comm):
    """True when a rank with no #k on comm may only be late: it is not waiting in a collective on another
    communicator (it is in an earlier call the others finished, or between calls)."""
    last = waiting(entries)
    return not (last and last["kind"] == "coll" and last["comm"] != comm)


def divergence(snap, np, moving):
    """The first #k where the ranks' calls differ. The ranks that made #k are compared first, a rank
    that may only be late left out: a crash can end a run while a slow rank trails the one whose call
    broke it. Where they all agree, a rank missing from #k is the finding after all (a hang leaves the
    rank that never came in an earlier call, or computing)."""
    found = _divergence(snap, np, moving, excuse_late=True)
    if found and found["late"]:
        found["lines"].append(f"{_ranks(found['late'])} had not reached #{found['seq']} when the run ended: "
                              "late, left out of the comparison")
    return found or _divergence(snap, np, moving, excuse_late=False)


def _divergence(snap, np, moving, excuse_late):
    colls = {r: [e for e in entries if e["kind"] == "coll"] for r, (_, entries) in snap.items()}
    comms = []
    for es in colls.values():
        comms += [e["comm"] for e in es if e["comm"] not in comms]
    comms.sort(key=lambda c: c != "world")
    for comm in comms:
        ms = [r for r in members(comm, np) if r in snap]
        by = {r: {e["seq"]: e for e in colls[r] if e["comm"] == comm} for r in ms}
        lo = max((min(s) for s in by.values() if s), default=1)
        hi = max((max(s) for s in by.values() if s), default=0)
        for k in range(lo, hi + 1):
            here = {r: by[r][k] for r in ms if k in by[r]}
            prints = collections.Counter(tuple(e[f] for f in FIELDS) for e in here.values())
            absent = [r for r in ms if r not in here]
            late = [r for r in absent if excuse_late and behind(snap[r][1], comm)]
            absent = [r for r in absent if r not in late]
            if len(prints) <= 1 and not absent:
                continue
            return dict(_name(comm, k, here, absent, prints, snap, moving), late=late)
    return None


def _fields(e):
    return tuple(e[f] for f in FIELDS)


def _usual(comm, k, here, prints, snap):
    """The fields most ranks made #k with; at a tie, the one the program made before (the same call
    from the same line, right after the same line as now, earlier in the records); None if no one is."""
    most = max(prints.values())
    top = [p for p, n in prints.items() if n == most]
    if len(top) == 1:
        return top[0]
    mine = {r: [e for e in snap[r][1] if e["kind"] == "coll" and e["comm"] == comm] for r in snap}
    before = {(a["site"], b["site"], _fields(b)) for es in mine.values() for a, b in zip(es, es[1:])
              if b["seq"] < k and b["seq"] == a["seq"] + 1}
    prev = {r: next((e for e in mine[r] if e["seq"] == k - 1), None) for r in here}
    made = [p for p in top if all(prev[r] and (prev[r]["site"], e["site"], p) in before
                                  for r, e in here.items() if _fields(e) == p)]
    return made[0] if len(made) == 1 else None


def _untold(comm, k, here, absent, snap, moving):
    """A tie nothing in the records breaks: what each rank did, and that it cannot tell."""
    lines = [f"the ranks differ at {comm}'s #{k}, and the records cannot tell which is at fault (no",
             "    majority, and no one's call is one the program made there before); each rank:"]
    groups = collections.defaultdict(list)
    for r, e in here.items():
        groups[(call(e), e["site"])].append(r)
    lines += [f"  {_ranks(rs)}: {what} at {site}" for (what, site), rs in sorted(groups.items(), key=lambda g: g[1])]
    lines += [f"  rank {r}: never called #{k}: it {where(snap[r][1], moving, r)}" for r in absent]
    e = next(iter(here.values()))
    return {"seq": k, "comm": comm, "call": call(e), "ranks": sorted([*here, *absent]), "state": e["state"],
            "rank": None, "field": "unknown", "lines": [p for line in lines for p in line.split("\n")]}


def _name(comm, k, here, absent, prints, snap, moving):
    common = _usual(comm, k, here, prints, snap)
    if common is None:
        return _untold(comm, k, here, absent, snap, moving)
    good = sorted(r for r, e in here.items() if _fields(e) == common)
    odd = sorted(r for r in here if r not in good)
    ref = here[good[0]]
    verb = {"started": "wait in" if len(good) > 1 else "waits in", "completed": "made",
            "enqueued": "enqueued"}[ref["state"]]
    lines = [f"{_ranks(good)} {verb} {call(ref)}" + (", not completed on the GPU" if verb == "enqueued" else "")]
    found = {"seq": k, "comm": comm, "call": call(ref), "ranks": odd + absent, "state": ref["state"]}
    earlier = {e["site"]: e["seq"] for r in good for e in snap[r][1] if e["kind"] == "coll" and e["seq"] < k}
    for r in odd:
        e, diff = here[r], [f for f in FIELDS if here[r][f] != ref[f]]
        if e["site"] != ref["site"] and e["site"] in earlier:
            lines.append(f"rank {r} skipped #{k} (the call at {ref['site']}) and went on to a later one:\n"
                         f"    {call(e)} at {e['site']}, the line the others' #{earlier[e['site']]} came from")
            found.setdefault("field", "skip")
        else:
            lines.append(f"rank {r}'s #{k} differs: " + ", ".join(f"{f} {e[f]} vs {ref[f]}" for f in diff))
            found.setdefault("field", diff[0])
        found.setdefault("rank", r)
    for r in absent:
        entries = snap[r][1]
        last = entries[-1] if entries else None
        if last and last["kind"] == "coll" and last["comm"] != comm and last["state"] != "completed":
            lines.append(f"rank {r} never called {comm}'s #{k}: it waits in {call(last)} instead\n"
                         "    (the communicator differs)")
            found.setdefault("field", "comm")
        else:
            lines.append(f"rank {r} never called #{k}: it {where(entries, moving, r)}")
            found.setdefault("outside", bool(last) and last["state"] == "completed")
            found.setdefault("field", "slow" if r in moving else "skip")
        found.setdefault("rank", r)
    found["lines"] = [part for line in lines for part in line.split("\n")]
    return found


SENDS = ("isend", "issend", "send", "ssend")  # --sanitize's sends in NCCL's order: each waits for its receive


def cycle(snap):
    """A deadlock of point-to-point waits: [r0, r1, ...] where each waits to receive from the next (or,
    in a send that waits for its receive, to send to it)."""
    waits = {}
    for r, (_, entries) in snap.items():
        last = waiting(entries)
        if last and last["kind"] == "p2p":
            waits[r] = [int(p[1:]) for p in last["peers"].split() if p[0] == "r" or last["op"] in SENDS]
    for start in sorted(waits):
        path, r = [start], start
        while True:
            nxt = next((p for p in waits.get(r, []) if p in waits), None)
            if nxt is None:
                break
            if nxt in path:
                return path[path.index(nxt):]
            path.append(nxt)
            r = nxt
    return None


def diagnose(snap, np, moving=()):
    """The first divergence among the ranks' records, as a dict with its lines; None if none."""
    if not snap:
        return None
    loop = cycle(snap)
    if loop:
        pairs = [f"rank {a} waits " + ("in a send to" if waiting(snap[a][1])["op"] in SENDS else "to receive from")
                 + f" {b}" for a, b in zip(loop, loop[1:] + loop[:1])]
        first = waiting(snap[loop[0]][1])
        return {"kind": "cycle", "field": "p2p-cycle", "rank": loop[0], "ranks": sorted(loop),
                "seq": first["seq"], "comm": first["comm"], "call": f"{first['op']} #{first['seq']}",
                "state": first["state"],
                "lines": ["point-to-point deadlock: " + "; ".join(pairs)] + (
                    ["  (enqueued on the GPU: the hosts queued these calls and wait in a sync)"]
                    if first["state"] == "enqueued" else [])}
    found = divergence(snap, np, moving)
    if found:
        found["kind"] = "divergence"
        missing = sorted(set(range(np)) - set(snap))
        if missing:
            found["lines"].append(f"{_ranks(missing)} left no record")
        return found
    slow = sorted(r for r in snap if r in moving)
    if slow:
        return {"kind": "slow", "field": "slow", "rank": slow[0], "ranks": slow, "seq": None,
                "lines": [f"{_ranks(slow)} still moving: slow, not stuck"]}
    return None
