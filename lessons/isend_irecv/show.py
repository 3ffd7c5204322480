"""What lesson 02 prints: the hazards rank by rank, the overlap table, and why, for the transport that ran."""
import sys
from collections import Counter

from common import mpilib, text


def mode(times, key):
    """The time of the mode named "(a) ...", "(b) ..." (key "(a)", "(b)") in `times`."""
    return next(t for m, t in times.items() if m.startswith(key))


def hazards(ctx, found, checked):
    """What each rank's buffers held (found: rank 0's gather of (early, later, after, seen)), counted;
    then the same under the sanitizer (checked: rank 0's gather of (outcomes, reports))."""
    if ctx.rank != 0:
        return

    def tally(i, found=found):
        return ", ".join(f"{what} on {k}" for what, k in sorted(Counter(f[i] for f in found).items()))
    # up to three outcomes per line: labels kept short so a line fits 100 columns at any NP < 1000
    print(f"what each rank's buffer held, ranks counted ({ctx.world_size} in all); old: what it held when the\n"
          "request was posted (-1s to receive into, 1s to send); new: the left neighbour's message (a\n"
          "receive), or the 2s written over the send buffer after posting (a send):\n"
          f"a posted receive buffer, read right after posting: {tally(0)}\n"
          f"  read after a barrier (the send posted), before the wait: {tally(1)}\n"
          f"  read after the wait: {tally(2)}\n"
          f"a send buffer overwritten before its wait arrived as: {tally(3)}")
    filled = any(f[1] != "old" for f in found)
    if ctx.api == "torch":
        print("gloo's threads write a posted receive buffer whenever the data arrives"
              + (" (before the wait here)" if filled else "") + ":\nit is undefined until wait(), "
              "and a tensor handed to isend must not be written until wait() either.", flush=True)
    else:
        print("MPI may write a posted receive buffer inside any MPI call before the wait"
              + (" (here, the barrier)" if filled else "") + ":\nit is undefined until the wait; and "
              "the standard forbids writing a posted send buffer\nbefore its wait.", flush=True)
    sanitized(ctx, checked, lambda i: tally(i, [c[0] for c in checked]))


def sanitized(ctx, checked, tally):
    """The hazards under common/sanitize.py: the outcomes, then each report once with its ranks."""
    print("\nthe same, sanitized (--sanitize): a receive goes to a buffer of the sanitizer's own and the\n"
          "posted one holds NaN until the wait; a send's data is taken at the rank's next call:\n"
          f"a posted receive buffer, read before the wait: {tally(0)}; after a barrier: {tally(1)}\n"
          f"  after the wait: {tally(2)}; a send buffer overwritten before its wait arrived as: {tally(3)}")
    said = Counter(line for _, reports in checked for line in reports)
    for line, k in sorted(said.items(), key=lambda item: item[0].split(": ", 1)[1]):
        what, where = line.split(": ", 1)
        print(f"{what}, on {k} of {ctx.world_size} ranks:\n  {where}")
    print("(a run with --sanitize stops at the first such report; plain, the same code passes or not,\n"
          "run by run)", flush=True)


def overlap(ctx, times, hidden, noise, slices, child, d_reason, seen):
    """The overlap table, what `hidden` means and this run's noise, (d)'s own job or why it did not run,
    why (for this transport), and what was seen."""
    if ctx.rank != 0:
        return
    t_a = mode(times, "(a)")
    rows = [[m, round(t * 1e6, 1), f"{t / t_a:.2f}" if m.startswith("(") else "",
             (f"{hidden[m[:3]]:+.2f}" + ("*" if m.startswith("(d)") else "")) if m.startswith("(") else ""]
            for m, t in times.items()]
    print(f"compute = {slices} slice(s), calibrated to last about as long as the exchange;\n"
          "rounds interleave the modes")
    print(text.table(["mode", "time us", "x (a)", "hidden"], rows, align=[False, True, True, True]))
    print("hidden = ((a) - time) / min(comm only, compute only): the share of the shorter part a mode\n"
          "saved against (a), which does one after the other. 1: all of it; 0: none; below 0: the mode\n"
          "was slower than (a), the exchange and the compute got in each other's way.\n"
          f"noise: (a) should take comm only + compute only; it was off by {noise:.2f} of the shorter part,\n"
          "so a hidden within that (and a margin) says nothing.")
    if child:
        ct = child["times"]
        print(f"(d)*: a job of its own, against its own (a) {mode(ct, '(a)') * 1e6:.0f} us (comm only "
              f"{ct['comm only'] * 1e6:.0f} us,\ncompute only {ct['compute only'] * 1e6:.0f} us); "
              f"its time is {mode(times, '(d)') / mode(times, '(b)'):.2f} x (b)'s.")
    else:
        print(text.wrapped(f"(d) {d_reason}"))
    for line in why_overlap(ctx, mpilib.current()) + seen:
        print(line)
    sys.stdout.flush()


def why_overlap(ctx, lib):
    """What moves the bytes on this run's transport, said for this transport and MPI library only."""
    if ctx.transport == "mpi":
        lines = text.wrapped(f"why ({lib.name if lib.kind != 'other' else 'MPI'}): a rendezvous message "
                             f"moves {mpilib.moves_large(lib)}; (c)'s Tests and the final Wait are such "
                             "calls, and posting alone does not move it.").splitlines()
        if ctx.single_node and lib.kind in ("mpich", "openmpi"):
            lines += text.wrapped(f"on one node {lib.name} moves it by memory copies that the ranks' own "
                                  "CPUs make inside those calls: a copy cannot overlap the compute of the "
                                  "rank making it; what (c)'s Tests can hide is time a rank would spend "
                                  "waiting for its partner's calls and copies.", indent="  ", hang=0).splitlines()
        return lines
    if ctx.transport == "gloo":
        return ["why (gloo): gloo moves point-to-point data on threads of its own, so (b) can overlap "
                "when a core", "  is free for them; is_completed() in (c) only asks, it moves nothing."]
    return ["why (nccl): NCCL moves the data with kernels on the GPU's SMs; compute kernels on another "
            "stream", "  share the SMs and the memory bandwidth with them, so overlap is partial at best; "
            "a stream", "  query in (c) only asks, it moves nothing."]
