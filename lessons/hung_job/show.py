"""What lesson 14 prints on rank 0: the record's last calls, the straggler, your reading, the cost."""
from common import report


def record(entries, last=6):
    print(f"rank 0's record, last {last} calls:")
    print(report.table(["#", "op", "dtype", "count", "root/peers", "comm", "state", "at"],
                       [(e["seq"], e["op"], e["dtype"], e["count"],
                         e["peers"] or (e["root"] if e["root"] >= 0 else ""), e["comm"], e["state"], e["site"])
                        for e in entries[-last:]]))


def straggler(slow):
    rank, waited = slow
    print(f"rank {rank} arrived last; the others waited {waited:.2f} s for it\n"
          "(from the median arrival to its own, summed over the world collectives)", flush=True)


def reading(clean, cases):
    print(f"the clean run: {'nothing to report' if clean == 'none' else clean}")
    print(report.table(["fault", "planted (rank, #k, field)", "yours", ""],
                       [(c["fault"], f"{c['want_rank']}, #{c['want_seq']}, {c['want_field']}",
                         f"{c['rank']}, #{c['seq']}, {c['field']}",
                         "ok" if (c["rank"], c["seq"], c["field"]) ==
                         (c["want_rank"], c["want_seq"], c["want_field"]) else "WRONG")
                        for c in cases]))


def cost(worst, checked):
    """worst: the slowest rank's seconds per call (record, bare, recorded)."""
    print(f"recording alone: {worst['record'] * 1e6:.1f} us per call (slowest rank)\n"
          f"an all-reduce of 1 float: {worst['bare'] * 1e6:.1f} us bare, {worst['recorded'] * 1e6:.1f} us recorded"
          + (" and checked (--debug-collectives)" if checked else ""), flush=True)
