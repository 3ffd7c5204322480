"""What lesson 03 prints in section 3: the per-rank table of bytes and peaks, and what the run showed."""
from common import report, text


def compare_title(ctx, big):
    report.section(ctx, f"3. each rank needs 1/{ctx.world_size} of a {4 * big / 1e6:.1f} MB float32 array: "
                   "broadcast-then-slice vs scatter")
    if ctx.rank == 0:
        print("by hand, with point-to-point calls whose bytes are counted as they are sent: a binomial-"
              "tree\nbroadcast, then each rank keeps its slice; a scatter in which the root sends piece "
              "r to rank r", flush=True)


def compare(ctx, everyone, wire_B, hand_us, lib_us, reps):
    """Rank 0: bytes sent, received and held per rank and way; then the byte and time gaps, said only
    as far as this run's numbers show them."""
    if ctx.rank != 0:
        return
    n = ctx.world_size
    print(text.table(
        ["rank", "method", "sent B", "received B", "peak held B", "time us", "max err"],
        [(r, m, d["sent_B"], d["recv_B"], d["peak_B"], round(d["time_us"], 1), d["err"])
         for r, res in enumerate(everyone) for m, d in res.items()],
        align=[True, False, True, True, True, True, True]))
    if n == 1:
        print("1 rank: the root is the only rank, nothing crosses the wire; both ways are a local slice")
    else:
        byte_gap = wire_B["bcast+slice"] / max(1, wire_B["scatter"])
        time_gap = hand_us["bcast+slice"] / hand_us["scatter"]
        senders = sum(r["bcast+slice"]["sent_B"] > 0 for r in everyone)
        print(f"on the wire, all ranks: bcast+slice {wire_B['bcast+slice']} B = (N-1) x the array, "
              f"scatter {wire_B['scatter']} B = the\narray less the root's piece: {byte_gap:.2f}x "
              f"(N = {n}). A broadcast by any algorithm must bring every non-root\nthe whole "
              "array; a scatter brings it its piece.")
        print(f"time, slowest rank, median of {reps}: by hand bcast+slice "
              f"{hand_us['bcast+slice']:.0f} us, scatter {hand_us['scatter']:.0f} us ({time_gap:.2f}x);"
              f"\nthe library's broadcast + slice {lib_us['bcast+slice']:.0f} us, "
              f"its scatter {lib_us['scatter']:.0f} us ({lib_us['bcast+slice'] / lib_us['scatter']:.2f}x).")
        if time_gap < byte_gap and senders > 1:
            print(f"the time gap is below the byte gap: the tree's bytes leave {senders} ranks, "
                  "several at once in its\nlater rounds, while the scatter's all leave the root.")
        else:
            print(f"in this run the time gap ({time_gap:.2f}x) is {'' if time_gap < byte_gap else 'not '}"
                  f"below the byte gap ({byte_gap:.2f}x); {senders} rank(s) sent in the tree.")
    print("(times are measured in this run and not checked: a loaded machine moves them)", flush=True)
