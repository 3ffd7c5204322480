"""What lesson 14 prints on rank 0: the record's last calls, the straggler, your reading, the cost; and
where every rank's error output goes while a planted fault runs."""
import os
import sys

from common import text


def errors_aside(rank):
    """A planted fault's run under the runner: this rank's stderr (MPI's error stack, a traceback, gloo's
    abort) goes to rankR.stderr in the run folder; the runner says it in one line under its diagnosis,
    and keeps it. Run by hand (no run folder) every line shows as it comes."""
    folder = os.environ.get("TUTOR_RUN_DIR")
    if not folder or not os.path.isdir(folder):
        return
    fd = os.open(os.path.join(folder, f"rank{rank}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stderr.flush()
    os.dup2(fd, 2)  # the library writes to descriptor 2, Python's sys.stderr too
    os.close(fd)


def record(entries, last=6, lucky=False):
    """The record's last calls; lucky: a planted fault's run got here, every call returned."""
    print(f"rank 0's record, last {last} calls:")
    print(text.table(["#", "op", "dtype", "count", "root/peers", "comm", "state", "at"],
                     [(e["seq"], e["op"], e["dtype"], e["count"],
                       e["peers"] or (e["root"] if e["root"] >= 0 else ""), e["comm"], e["state"], e["site"])
                      for e in entries[-last:]]))
    if lucky:
        print("the fault did not stop this run: every call returned and every value checked was right,\n"
              "by luck (the library let the mismatch through); the ranks' records still hold it", flush=True)


def straggler(slow):
    rank, waited = slow
    print(f"rank {rank} arrived last; the others waited {waited:.2f} s for it\n"
          "(from the median arrival to its own, summed over the world collectives)", flush=True)


def reading(clean, cases):
    """One row a fault, one column a plant (the ranks it went on, of how many): ok, or what yours said
    (rank, #k, field; of two ranks alike, the lower is the answer)."""
    print(f"the clean run: {'nothing to report' if clean == 'none' else clean}")
    plants = list(dict.fromkeys((c["world"], c["planted_on"], *c["also"]) for c in cases))
    faults = list(dict.fromkeys(c["fault"] for c in cases))
    said = {(c["fault"], c["world"], c["planted_on"], *c["also"]): "ok" if (c["rank"], c["seq"], c["field"]) ==
            (c["want_rank"], c["want_seq"], c["want_field"]) else f"{c['rank']}, #{c['seq']}, {c['field']}"
            for c in cases}
    want = {c["fault"]: f"#{c['want_seq']}, {c['want_field']}" for c in cases}
    print(text.table(["fault", "want", *(f"on {'+'.join(map(str, on))} of {n}" for n, *on in plants)],
                     [(f, want[f], *(said[(f, *p)] for p in plants)) for f in faults]))
    print("(a cell: ok, or what yours named instead: rank, #k, field)")


def cost_verdict(secs, noise):
    """'more' when the recorded all-reduce took longer than the bare one by more than this run's noise
    (the larger of the two's spreads), 'less' when shorter by more than it, else 'noise'."""
    gap, wander = secs["recorded"] - secs["bare"], max(noise["recorded"], noise["bare"])
    return "noise" if abs(gap) <= wander else ("more" if gap > 0 else "less")


def cost(secs, noise, verdict, checked):
    """secs, noise: the slowest rank's seconds per call and its batches' spread (record, bare, recorded)."""
    us = {k: v * 1e6 for k, v in secs.items()}
    gap, wander = us["recorded"] - us["bare"], max(noise["recorded"], noise["bare"]) * 1e6
    what = "recorded and checked" if checked else "recorded"  # --debug-collectives checks each call
    print(f"recording alone: {us['record']:.1f} us per call (noise {noise['record'] * 1e6:.1f} us)\n"
          f"an all-reduce of 1 float: {us['bare']:.1f} us bare, {us['recorded']:.1f} us {what}"
          f" (noise {wander:.1f} us)")
    print({"more": f"{what} costs {gap:.1f} us more a call, beyond this run's noise",
           "noise": f"the difference, {gap:+.1f} us, is within this run's noise: recording's cost is lost in it",
           "less": f"{what} ran {-gap:.1f} us faster, beyond the noise: the machine's load, not the\n"
                   "recorder (it only adds work), moved the clock"}[verdict], flush=True)
