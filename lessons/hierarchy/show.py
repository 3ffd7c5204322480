"""What lesson 15 prints on rank 0: the nodes found, the bytes counted, the race and its verdict, the
dispatch. Each takes what the page gathered; none talks to the other ranks."""
from common import text, timing
from lessons.hierarchy.reference import DMODEL, EXPERTS, TOPK

TRANSPORT = {"mpi": "MPI's shared memory", "gloo": "gloo's TCP sockets (inside a node too)",
             "nccl": "NCCL's own paths (NVLink, PCIe or shared memory)"}


def say(paragraph):
    print(text.wrapped(paragraph), flush=True)


def plural(count, word):
    return f"{count} {word}" + ("" if count == 1 else "s")


def nodes(lay, places, args, transport):
    """Section 1: how the nodes were found, which world ranks each holds, and where they really run."""
    kind, m, k, mesh = lay["kind"], lay["m"], lay["k"], lay["mesh"]
    how = (f"real: MPI's shared-memory split found {plural(m, 'node')} x {plural(k, 'rank')}" if kind == "real" else
           f"one real node, this machine (MPI's shared-memory split), its ranks split into {m} groups of "
           f"{k} that stand in for nodes: {lay['placement']} placement, from {args.shape_from}")
    if kind == "real" and m > 1 and args.asked:
        how += "; --groups, --ranks-per-node and --placement not used: the nodes are real"
    say(f"nodes: {how}")
    print(text.table(["node", "world ranks (local rank 0, 1, ...)", "really on"],
                     [[j, text.brief(row), text.brief(sorted({places[r][0] for r in row}))]
                      for j, row in enumerate(mesh)]))
    say(f"inside a node: {TRANSPORT[transport]}; " + (
        "across, the network joining the hosts (on this kit's test bed a veth pair in one kernel: no "
        "NIC, no InfiniBand, bandwidth set by this machine)" if kind == "real" and m > 1 else
        "the groups share this one node's transport: across goes the way inside does, so only the "
        "counts and steps differ, not the time a byte takes"))


def counts(every, sums, lay, n, itemsize, count):
    """Section 2: bytes each rank sent, by where its peer runs, beside the closed forms."""
    k, m = lay["k"], lay["m"]

    def span(key):
        return text.per_rank(sorted({e[key] for e in every}) if len({e[key] for e in every}) == 1
                        else [e[key] for e in every])
    print(f"{count} items of {itemsize} B per rank; bytes each rank sent, by where its peer runs")
    print(text.table(["scheme", "steps", "inside its node B", "across nodes B", "all across",
                      "max rel err"],
                     [["flat ring", span("flat_steps"), span("flat_inside"), span("flat_across"),
                       sums["flat_across_total"], max(e["flat_err_ref"] for e in every)],
                      ["two levels", span("two_steps"), span("two_inside"), span("two_across"),
                       sums["two_across_total"], max(e["err_ref"] for e in every)]], align=[0, 0, 0, 0, 1, 1]))
    say(f"closed forms: a flat ring takes 2(N-1) = {2 * (n - 1)} steps, two levels 2(K-1) + 2(M-1) = "
        f"{2 * (k - 1) + 2 * (m - 1)}; across nodes, two levels send exactly 2(M-1) x C = "
        f"{2 * (m - 1) * count * itemsize} B from all ranks together, about 2(M-1)/M x C/K from each. "
        "max |rel err|: against one process (float64); the bound is (N-1) x eps")
    if m > 1:
        say(measured_across(sums, m, count * itemsize))


def times(a, b):
    return f" (x{a / b:.2f})" if b else ""


def measured_across(sums, m, c):
    """Bytes across nodes as this run counted them, per rank and per node, beside what a leader-based
    two levels would send (a closed form: it is not run here)."""
    rank = [sums["flat_across_max"], sums["two_across_max"]]
    node = [sums["flat_across_node_max"], sums["two_across_node_max"]]
    leader = round(2 * (m - 1) / m * c)
    return (f"Counted across nodes: the most one rank sent was {rank[0]} B flat, {rank[1]} B in two "
            f"levels{times(*rank)}; the most one node sent, {node[0]} B flat, {node[1]} B in two "
            f"levels{times(*node)}. Leader-based two levels (not run here) would send about 2(M-1)/M x C = "
            f"{leader} B from each node too, all of it through one rank's link instead of K.")


def race_verdict(rows, lay, sums, transport):
    """A sentence on two levels vs the flat ring at the largest size, only beyond this run's noise."""
    big = max(r["size"] for r in rows)
    t = {r["algo"]: r for r in rows if r["size"] == big}
    flat_t, two_t = t["flat ring"]["time_us"], t["two levels"]["time_us"]
    noise = max(t["flat ring"]["noise_us"], t["two levels"]["noise_us"])
    said = (f"at {big} B: flat ring {flat_t:.1f} us, two levels {two_t:.1f} us, noise {noise:.1f} us "
            f"(the larger spread of {timing.BATCHES} batches): ")
    if abs(flat_t - two_t) <= noise:
        return said + "a tie within this run's noise"
    faster = "two levels beat the flat ring" if two_t < flat_t else "the flat ring beat two levels"
    said += f"{faster}, x{max(flat_t, two_t) / min(flat_t, two_t):.2f}. "
    k, m = lay["k"], lay["m"]
    steps = (f"two levels take {2 * (k - 1) + 2 * (m - 1)} steps ({2 * (k - 1)} inside a node with "
             f"messages M = {m} x the flat ring's, {2 * (m - 1)} across with the same), the flat ring "
             f"{2 * (k * m - 1)}")
    if lay["m"] < 2:
        return said + "One node: two levels are lesson 09's halves alone; " + steps
    if lay["kind"] == "pretend":
        return said + (f"The groups stand in for nodes on one node: {TRANSPORT[transport]} carries inside "
                       f"and across alike, so this is no slower network; {steps}")
    c = sums["buffer_bytes"]
    return said + (f"Counted in section 2, as shares of the buffer C: the most one rank sent across was "
                   f"{sums['flat_across_max'] / c:.2f} x C flat, {sums['two_across_max'] / c:.2f} x C in two levels; "
                   f"the most one node sent, {sums['flat_across_node_max'] / c:.2f} x C and "
                   f"{sums['two_across_node_max'] / c:.2f} x C")


def model(cal, ratios):
    """Section 3 on real nodes: the calibrated links, and flat ring / two levels measured and predicted."""
    (a_in, b_in), (a_x, b_x) = cal["in"], cal["x"]

    def link(alpha, beta):
        return f"alpha {alpha * 1e6:.0f} us, " + (f"{1e-9 / beta:.3g} GB/s" if beta > 0 else "beta below noise")
    say(f"alpha-beta model of this run's links (lessons/hierarchy/model.py): inside a node {link(a_in, b_in)}; "
        f"into a node across {link(a_x, b_x)}. Flat ring time / two levels' time:")
    print(text.table(["size B", "measured", "predicted", "measured / predicted"],
                     [[size, f"x{got:.2f}", f"x{want:.2f}", f"{got / want:.2f}" if want else "-"]
                      for size, got, want in ratios], align=[1, 1, 1, 1]))


def race(rows, lay, sums, pick, transport, cal=None, ratios=None):
    """Section 3: nccl-tests' columns for the three all-reduces, the model on real nodes, the verdict."""
    print(f"time: best of {timing.BATCHES} batches, each the slowest rank's mean of {pick['iters']}; "
          "busbw = algbw x 2(N-1)/N\nvs flat: the flat ring's time / this one's; #wrong: items off "
          "the library's by > 2(N-1) x eps")
    print(text.table(["size B", "count", "type", "redop", "algorithm", "time us", "algbw", "busbw",
                      "#wrong", "vs flat"],
                     [[r["size"], r["count"], r["type"], r["redop"], r["algo"], round(r["time_us"], 1),
                       round(r["algbw"], 3), round(r["busbw"], 3), r["wrong"], round(r["vs_flat"], 2)]
                      for r in rows], align=[1, 1, 0, 0, 0, 1, 1, 1, 1, 1]))
    if cal:
        model(cal, ratios)
    say(race_verdict(rows, lay, sums, transport))


def moe(every, sums, tokens):
    """Section 4: each rank's rows across, flat and layered, and the de-duplication they show."""
    w = 8 * (DMODEL + 2)
    print(text.wrapped(f"{tokens} tokens of {DMODEL} float64 features per rank, top-{TOPK} of {EXPERTS} "
                       f"experts per rank; a row on the wire is {w} B (features, token id, expert bits)"))
    print(text.table(["rank", "rank pairs", "node pairs", "flat across B", "layered across B",
                      "fan-out inside B", "#wrong"],
                     [[r, e["remote_rank_pairs"], e["remote_node_pairs"], e["moe_flat_across"],
                       e["moe_layered_across"], e["moe_fan_inside"], e["moe_wrong_flat"] + e["moe_wrong_ref"]]
                      for r, e in enumerate(every)]))
    pairs = [sum(e[key] for e in every) for key in ("remote_rank_pairs", "remote_node_pairs")]
    sent = [sum(e[key] for e in every) for key in ("moe_flat_across", "moe_layered_across")]
    said = (f"This routing's de-duplication factor: {pairs[0]} / {pairs[1]} = {sums['moe_dedup']:.4f}; bytes "
            f"across nodes, flat / layered: {sent[0]} / {sent[1]} = {sums['moe_across_ratio']:.4f}" if pairs[1]
            else "No token has an expert on another node here: nothing crosses, either way")
    say("pairs: a token and a rank (a node) on another node that holds any of its experts. "
        f"{said}. #wrong: tokens delivered unlike the flat dispatch or one process")
