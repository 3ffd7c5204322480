"""Lesson 16's cluster on paper: link classes from data sheets, collectives priced by lesson 07's
alpha-beta formulas, and the published figures the prices are checked against.

    Cluster(gpus_per_node, nodes, intra, nic, nics_per_node, links)   one GPU's links, one direction, B/s
    ring(n, nbytes, alpha, bw, calls)  lesson 07's ring all-reduce, nbytes in all over `calls` calls
    ring_time(cluster, nbytes, calls)  a ring over every rank of a cluster (section 2's step)
    two_level(cluster, nbytes, calls)  the hierarchy: reduce-scatter in the node, all-reduce across, all-gather
    nccl_times(cluster, nbytes, nvls)  NCCL's ring, tree, NVLS, NVLS tree, each its own alpha-beta price
    busbws(cluster, nbytes, nvls)   each one's busbw (and time), nccl-tests' busbw
    pick(times)                     what NCCL's tuner runs: the least priced time
    price(figure)                   busbw of each algorithm at the rate the links run, NCCL's pick (from its
                                    own link table: tuner_intra), and each one's busbw as the table prices it
    FIGURES, MISSES                 published all-reduce busbw, each with its address and the phrase read
    SOURCE_ROWS                     the published figures an efficiency was read from, shown, not checked

Every number below was read at the address beside it (the results JSON keeps each); nothing here
is fitted to the figures it is checked against: an efficiency per kind of link, each cited.
"""
import math
from dataclasses import dataclass

from common import bandwidth

GB = 1e9
NCCL = "https://github.com/NVIDIA/nccl/blob/master/src/graph/"  # + topo.h, tuning.cc
# Link classes: bandwidth per GPU in ONE direction (a data sheet's NVLink figure is both directions:
# "900 GB/s is the sum of both directions, at the wire speed", https://github.com/NVIDIA/nccl/issues/1442),
# and an efficiency per KIND of link, each from its own source, none fitted to the figures below:
#   NVLink: NCCL prices one NVLink at SM80_NVLINK_BW 20.0 GB/s (A100) and SM90_NVLINK_BW 20.6 (H100) in
#           src/graph/topo.h, of the link's 25 GB/s each way: 0.800 and 0.824.
#   a NIC:  NCCL's maintainer: "24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)"
#           (https://github.com/NVIDIA/nccl-tests/issues/119): 24 of 25 GB/s, 0.96, InfiniBand or RoCE.
# alpha_us: NCCL's own latency a ring step costs on that kind of link (tuning.cc hwLatencies, Simple
# protocol: NVLink 3.4 us, NET 14 us); at the figures' GiB sizes it moves no busbw by 1%.
NVL_EFF = {"A100": 20.0 / 25, "H100": 20.6 / 25}
NIC_EFF = 24 / 25
NVL_SOURCE = NCCL + "topo.h"
NIC_SOURCE = "https://github.com/NVIDIA/nccl-tests/issues/119"
LINKS = {
    "nvlink4": dict(GBps=900 / 2, alpha_us=3.4, eff=NVL_EFF["H100"], eff_source=NVL_SOURCE, kind="nvlink",
                    what="NVLink 4 (H100, H200)",
                    source="https://glennklockwood.com/garden/processors/h100 (H100); https://semifly.ai/articles/"
                           "why-nvidia-h200-and-nccl-are-reshaping-ai-training-efficiency-at-scale (H200)"),
    "nvlink3": dict(GBps=600 / 2, alpha_us=3.4, eff=NVL_EFF["A100"], eff_source=NVL_SOURCE, kind="nvlink",
                    what="NVLink 3 (A100)", source="https://www.nvidia.com/de-de/data-center/nvlink/"),
    "nvlink3_a800": dict(GBps=400 / 2, alpha_us=3.4, eff=NVL_EFF["A100"], eff_source=NVL_SOURCE, kind="nvlink",
                         what="NVLink 3 capped (A800)",
                         source="https://tweakers.net/nieuws/203182/nvidia-introduceert-a800-gpu-voor-china-"
                                "die-niet-onder-exportrestricties-vs-valt.html"),
    # nccl#1221's own H100 nodes, measured: "330GB" busbw of one node's ring (NVLS off), where NCCL's table
    # prices 370.8 (18 NVLinks x 20.6): these links run at 330 of 450 GB/s. NCCL's tuner still prices
    # them from its table (tuner_intra below): what a node measures does not move NCCL's pick
    "nvlink4_1221": dict(GBps=900 / 2, alpha_us=3.4, eff=330 / 450, kind="nvlink",
                         eff_source="https://github.com/NVIDIA/nccl/issues/1221",
                         what="NVLink 4, nccl#1221's nodes, measured",
                         source="https://glennklockwood.com/garden/processors/h100"),
    # a NIC's Gb/s is each way, as NCCL's maintainers read it
    "ndr": dict(GBps=400 / 8, alpha_us=14.0, eff=NIC_EFF, eff_source=NIC_SOURCE, kind="nic",
                what="InfiniBand NDR / 400GbE (ConnectX-7)",
                source="https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"),
    "hdr": dict(GBps=200 / 8, alpha_us=14.0, eff=NIC_EFF, eff_source=NIC_SOURCE, kind="nic",
                what="InfiniBand HDR (ConnectX-6)", source="https://lenovopress.lenovo.com/lp1195"),
    # AWS p5: "up to 32 network cards ... up to 3,200 Gbps": 100 Gb/s a card. No figure of what NCCL
    # reaches on one EFA was found: a NIC's 0.96 stands in (on p5 the ring is NVLink-bound and the NVLS
    # tree held by NCCL's cap, so no row below moves with it)
    "efa": dict(GBps=100 / 8, alpha_us=14.0, eff=NIC_EFF, eff_source=NIC_SOURCE, kind="nic",
                what="AWS EFA, one of p5's 32 cards",
                source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/p5-efa.html"),
}
ALPHA_SOURCE = NCCL + "tuning.cc"
# NCCL's tuner (src/graph/tuning.cc, ncclTopoTuneModel), Simple protocol, microseconds: a call's base
# latency, each algorithm's latency per hop on NVLink and on the network; and two bandwidth factors:
# a tree all-reduce gets .92 of its links ("busBw * .92"), NVLS 0.85 on Hopper (nvlsEfficiency).
# NVLS tree's busbw is capped per channel (tuning.cc: "bw = std::min({intraBw, interBw, ... ? (float)
# perChMaxNVLSTreeBw"), Hopper's perChMaxNVLSTreeBws {0.0, 57.7, 45.5} GB/s on 1 / 2 / 3+ nodes; its
# channels are the NVLS graph's heads, one a GPU of the node at most NCCL_MAX_NVLS_ARITY (32;
# src/graph/search.cc: "graph->maxChannels = std::min(NCCL_MAX_NVLS_ARITY, system->nodes[GPU].count)")
TUNER = dict(ring_base_us=8.4, ring_nvl_us=3.4, ring_net_us=14.0, tree_base_us=8.4, tree_nvl_us=4.0,
             tree_net_us=14.0, nvls_nvl_us=25.0, nvls_tree_net_us=20.9, tree_eff=0.92, nvls_eff=0.85,
             nvls_tree_ch2_GBps=57.7, nvls_tree_ch_GBps=45.5, nvls_arity=32)
ALGOS = ("ring", "tree", "nvls", "nvls_tree")


@dataclass
class Cluster:
    gpus_per_node: int
    nodes: int
    intra: str            # a LINKS key: the GPU's link into the node's switch
    nic: str = "ndr"      # a LINKS key: one NIC
    nics_per_node: int = 8
    links: dict = None    # the link classes by name: LINKS, or a learner's table (LINKS and their own)

    @property
    def n(self):
        return self.gpus_per_node * self.nodes

    def bw(self, link):
        table = self.links or LINKS  # B/s NCCL gets out of one link: its rate x its kind's efficiency
        return table[link]["GBps"] * GB * table[link]["eff"]

    def alpha(self, link):
        return (self.links or LINKS)[link]["alpha_us"] * 1e-6


def specs(c):
    """Cluster c's shape and raw link specs, as a results row reports them (the runner prices from them)."""
    table = c.links or LINKS
    return dict(gpus_per_node=c.gpus_per_node, nodes=c.nodes, nics_per_node=c.nics_per_node,
                intra_GBps=table[c.intra]["GBps"], nic_GBps=table[c.nic]["GBps"],
                eff_intra=table[c.intra]["eff"], eff_nic=table[c.nic]["eff"],
                alpha_intra_us=table[c.intra]["alpha_us"], alpha_nic_us=table[c.nic]["alpha_us"])


def bottleneck(c):
    """B/s each rank's ring moves (one direction): NCCL runs one ring per NIC, so across nodes the
    rings together get nics_per_node NICs through each node's edge, and every ring also crosses each
    GPU's own link into the node."""
    if c.nodes == 1:
        return c.bw(c.intra)
    return min(c.bw(c.intra), c.nics_per_node * c.bw(c.nic))


def ring(n, nbytes, alpha, bw, calls=1):
    """Lesson 07's ring all-reduce (its predict("ring", ...) without gamma: the GPU adds far faster than
    links move) of nbytes in all, split over `calls` calls: each call pays the ring's 2(N-1) latencies,
    so calls x 2(N-1) alpha + 2(N-1)/N nbytes / bw."""
    return calls * 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw


def ring_time(c, nbytes, calls=1):
    """The ring over every rank of cluster c, at the slowest link class it crosses."""
    alpha = c.alpha(c.nic) if c.nodes > 1 else c.alpha(c.intra)
    return ring(c.n, nbytes, alpha, bottleneck(c), calls)


def reduce_scatter_time(n, nbytes, alpha, bw, calls=1):
    """Half of the ring all-reduce, nbytes in all over `calls` calls: calls x (N-1) alpha + (N-1)/N
    nbytes / bw (an all-gather costs the same)."""
    return calls * (n - 1) * alpha + (n - 1) / n * nbytes / bw


def two_level(c, nbytes, calls=1):
    """The hierarchy lesson's two levels, one after the other, each call: reduce-scatter inside each
    node, an all-reduce of each GPU's 1/g across the nodes (each GPU on its share of the node's NICs),
    then an all-gather inside the node. On one node it is the ring."""
    g, m = c.gpus_per_node, c.nodes
    if m == 1:
        return ring_time(c, nbytes, calls)
    intra = 2 * reduce_scatter_time(g, nbytes, c.alpha(c.intra), c.bw(c.intra), calls)
    share = min(c.bw(c.intra), c.nics_per_node * c.bw(c.nic) / g)  # this GPU's part of the node's NICs
    return intra + ring(m, math.ceil(nbytes / g), c.alpha(c.nic), share, calls)


def tree_hops(m):
    """Node-to-node bytes of a double binary tree, in buffers each way per node: none on one node; on
    two, each node is root of one tree and leaf of the other (half up, half down: one buffer); on more,
    a node inner in one tree takes two children's halves up and sends two down (two buffers)."""
    return 0 if m == 1 else 1 if m == 2 else 2


def nccl_times(c, nbytes, nvls=False):
    """{algorithm: seconds} of one all-reduce of nbytes on cluster c, each algorithm NCCL's tuner prices
    (tuning.cc: its latencies, its tree and NVLS factors), its bandwidth the bytes each link carries:
      ring       2(n-1)/n of the buffer over each GPU's slowest link class (lesson 07)
      tree       a chain in the node (2 buffers over each GPU's NVLink: up, then down) and a double
                 binary tree across nodes (tree_hops buffers over the node's NICs), at .92
      nvls       NVLink SHARP in one node: each GPU's link carries (n+1)/n of the buffer, at 0.85
      nvls_tree  NVLS in the node, a tree across nodes: the slowest of the two and of NCCL's busbw
                 cap, a channel a GPU (at most 32) at 57.7 GB/s on two nodes, 45.5 on more
    nvls: the switch has NVLink SHARP (NVSwitch 3, H100 and later)."""
    t, g, m, n = TUNER, c.gpus_per_node, c.nodes, c.n
    nvl, net = c.bw(c.intra), c.nics_per_node * c.bw(c.nic)
    log2m = int(math.log2(m))  # NCCL's log2i: the tree's depth
    out = {"ring": (t["ring_base_us"] + (2 * (n - 1) - 2 * (m - 1)) * c.alpha(c.intra) * 1e6 +
                    2 * (m - 1) * c.alpha(c.nic) * 1e6) * 1e-6 + 2 * (n - 1) / n * nbytes / bottleneck(c),
           "tree": (t["tree_base_us"] + 2 * ((g - 1) * t["tree_nvl_us"] + log2m * t["tree_net_us"])) * 1e-6 +
           max(2 * nbytes / nvl, tree_hops(m) * nbytes / net) / t["tree_eff"]}
    if nvls and m == 1:
        out["nvls"] = t["nvls_nvl_us"] * 1e-6 + (g + 1) / g * nbytes / (t["nvls_eff"] * nvl)
    if nvls and m > 1:
        cap = min(g, t["nvls_arity"]) * (t["nvls_tree_ch2_GBps"] if m == 2 else t["nvls_tree_ch_GBps"]) * GB
        out["nvls_tree"] = (t["nvls_nvl_us"] + 2 * log2m * t["nvls_tree_net_us"]) * 1e-6 + \
            max((g + 1) / g * nbytes / (t["nvls_eff"] * nvl), tree_hops(m) * nbytes / net,
                2 * (n - 1) / n * nbytes / cap)
    return out


def pick(times):
    """NCCL's choice: the algorithm its tuner prices fastest (ncclTopoGetAlgoTime's least time)."""
    return min(times, key=times.get)


def busbws(c, nbytes, nvls=False, per=1):
    """({algorithm: busbw GB/s}, {algorithm: seconds}) of one all-reduce of nbytes on cluster c, each
    algorithm NCCL has there (nccl_times); busbw common/bandwidth.py's (nccl-tests'), over `per` (NICs)."""
    times = nccl_times(c, nbytes, nvls)
    return {a: bandwidth.busbw("allreduce", nbytes, s, c.n) / per for a, s in times.items()}, times


def priced(row, intra, links=None):
    """busbws() of one figure's row with its GPUs' links of class `intra`, per NIC where it is per NIC."""
    c = Cluster(row["gpus_per_node"], row["nodes"], intra, row["nic"], row["nics_per_node"], links)
    return busbws(c, row["size"], row["nvls"], row["nics_per_node"] if row["per_nic"] else 1)


def price(row, links=None):
    """What one figure's cluster runs: ({algorithm: busbw} at the rate its links run, NCCL's pick,
    {algorithm: busbw} as NCCL's tuner prices them). The tuner prices NVLink from its own table
    (tuner_intra), so a node that runs slower than the table (nccl#1221's) gets the table's pick, at its
    own rate; a run held to one algorithm (NCCL_ALGO) runs that one."""
    (runs, node_times), (tuner, times) = (priced(row, intra, links) for intra in (row["intra"], row["tuner_intra"]))
    return runs, row["forced"] or pick(times), tuner


def reported(row):
    """One figure as the results JSON keeps it: the cluster's shape and raw link specs (the runner prices
    again from them), NCCL's pick, the published figure and where it was read; views: every algorithm's
    busbw (0 where the cluster has none) at the rate the links run ('runs') and at NCCL's table's
    ('tuner'), each with its NVLink efficiency and its busbw of the pick."""
    intra, nic = LINKS[row["intra"]], LINKS[row["nic"]]
    runs, algo, tuner = price(row)
    out = {k: row[k] for k in ("label", "gpus_per_node", "nodes", "nics_per_node", "per_nic", "size", "nvls",
                               "forced", "chosen_by", "published", "source", "phrase", "why", "node_ring_GBps")}
    out["chosen_source"] = AWS_TUNER if row["chosen_by"] == "aws-ofi-nccl" else ""  # where its pick was read
    views = [dict(view=name, eff_intra=LINKS[link]["eff"], algo_bw=bw[algo],
                  **{f"{a}_bw": bw.get(a, 0.0) for a in ALGOS})
             for name, link, bw in (("runs", row["intra"], runs), ("tuner", row["tuner_intra"], tuner))]
    out.update(intra_GBps=intra["GBps"], tuner_eff_intra=LINKS[row["tuner_intra"]]["eff"], nic_GBps=nic["GBps"],
               eff_nic=nic["eff"], alpha_intra_us=intra["alpha_us"],
               alpha_nic_us=nic["alpha_us"], algo=algo, predicted=runs[algo], ratio=runs[algo] / row["published"],
               views=views)
    return out


def _fig(label, gpn, nodes, intra, nic, nics, published, source, phrase, size=8 << 30, per_nic=False,
         nvls=False, forced="", why="", tuner_intra=None, node_ring_GBps=0.0, chosen_by="NCCL_ALGO"):
    """nvls: the node's switch has NVLink SHARP; forced: the algorithm chosen outside NCCL's own tuner,
    by chosen_by (NCCL_ALGO: the run was held to it; aws-ofi-nccl: AWS's tuner plugin), else NCCL chose;
    why: for a miss, the reason a learner can check at the source; tuner_intra: the link class NCCL's
    tuner prices the GPUs' links as (its table), where they run slower (node_ring_GBps: the source's own
    one-node ring busbw they were measured at)."""
    return dict(label=label, gpus_per_node=gpn, nodes=nodes, intra=intra, nic=nic, nics_per_node=nics,
                size=size, per_nic=int(per_nic), nvls=int(nvls), forced=forced,
                chosen_by=chosen_by if forced else "", published=published,
                source=source, phrase=phrase, why=why, tuner_intra=tuner_intra or intra,
                node_ring_GBps=node_ring_GBps)


# all-reduce busbw (GB/s) published for real machines: NCCL's maintainers, or users' nccl-tests output
FIGURES = [
    _fig("1 x 8 A100, NVSwitch", 8, 1, "nvlink3", "hdr", 4, 240, "https://github.com/NVIDIA/nccl/issues/1712",
         "your GPUs are NVLink-connected, so you should be seeing close to 240 GB/s in that case"),
    _fig("1 x 8 A800, NVSwitch", 8, 1, "nvlink3_a800", "hdr", 1, 160, "https://github.com/NVIDIA/nccl/issues/412",
         "you should get ~160GB/s  intra-node and 24GB/s inter-node"),
    _fig("1 x 8 H100, NVLink SHARP", 8, 1, "nvlink4", "ndr", 8, 480,
         "https://github.com/NVIDIA/nccl-tests/issues/212",
         "On 8 GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)", nvls=True),
    _fig("1 x 8 H200, NVLink SHARP", 8, 1, "nvlink4", "ndr", 8, 475,
         "https://github.com/NVIDIA/nccl-tests/issues/272", "The output shows peak bandwidth of 475 GB/s",
         nvls=True),
    _fig("12 x 8 A800, 1 HDR NIC", 8, 12, "nvlink3_a800", "hdr", 1, 24,
         "https://github.com/NVIDIA/nccl/issues/412",
         "you should get ~160GB/s  intra-node and 24GB/s inter-node"),
    # nodes not said: 2 priced, where NCCL's tree beats its ring on these links
    _fig("2 x DGX A100, 8 HDR NICs", 8, 2, "nvlink3", "hdr", 8, 192,
         "https://github.com/NVIDIA/nccl/issues/812",
         "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW"),
    # a NIC's rate, read (as nccl-tests#319 advises at 2 nodes) with NCCL_ALGO=RING
    _fig("2 x 8 H100, NDR, per NIC", 8, 2, "nvlink4", "ndr", 8, 47,
         "https://github.com/NVIDIA/nccl-tests/issues/290",
         "For NDR @ 400Gbps you should see 46-48GB/s per NIC", per_nic=True, nvls=True, forced="ring"),
    _fig("2 x 8 H100, 8 x CX7 400G", 8, 2, "nvlink4", "ndr", 8, 396,
         "https://github.com/NVIDIA/nccl-tests/issues/319",
         "aggregated to achieve up to ~396GB/s with the RING protocol", nvls=True, forced="ring"),
]
# an efficiency's own source, shown and not checked: the NIC's (4 x 24 GB/s), nccl#1221's nodes' NVLink
ROCE = "https://github.com/NVIDIA/nccl/issues/1221"
ROCE_PHRASE = "the bus BW will upgraded from 330GB to 430GB"  # its 1 or 2 nodes, NVLS off, then on
SOURCE_ROWS = [
    _fig("3 x 8 A100, 4 HDR NICs a node", 8, 3, "nvlink3", "hdr", 4, 96,
         "https://github.com/NVIDIA/nccl-tests/issues/119",
         "24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs), so in your case 96GB/s is "
         "the target"),
    _fig("1 x 8 H100, nccl#1221's node, NVLS off", 8, 1, "nvlink4_1221", "ndr", 8, 330, ROCE, ROCE_PHRASE,
         tuner_intra="nvlink4", node_ring_GBps=330),
]
# nccl#1221's 8 x H100 nodes, 8 x 400G RoCE NICs each: NCCL's pick from its own table, at their links' rate
FIGURES += [
    _fig(f"{m} x 8 H100, 8 x 400G RoCE{', NVLS' * nvls}", 8, m, "nvlink4_1221", "ndr", 8, publ, ROCE, phrase,
         nvls=nvls, tuner_intra="nvlink4", node_ring_GBps=330)
    for m, nvls, publ, phrase in ((1, True, 430, ROCE_PHRASE), (2, True, 430, ROCE_PHRASE),
                                  (4, True, 320, "same busbw 320GB"))
]  # not its 2 nodes without NVLS (330): NVLink-bound like its one node, the source row below, it tells nothing
MISSES = []  # what the model misses, each with the reason the source itself gives
# cloud vendors' and users' published runs (nccl-tests busbw, in-place, at the largest size they ran)
AZURE = "https://github.com/Azure/AI-benchmarking-guide/blob/main/Azure_Results/"
P5 = "https://github.com/crazyguitar/aws-gpu-communication-benchmark/blob/main/data/nccl_all_reduce.csv"
# On AWS p5 NCCL's own tuner does not pick: aws-ofi-nccl, AWS's EFA plugin, ships a tuner that picks from
# regions of (size, ranks) measured on p5 (region_init_internal_p5_p5e, 8 GPUs a node). Its all-reduce
# runs the ring (Simple) from 1610612736 B at 32 ranks, 2684354560 at 64, 8053063680 at 160 and
# 9663676416 at 192 (a straight line between vertices, in log2 of both; beyond, extended); from 2684354560
# B up to there, NVLS tree at 128 ranks and more; at 16 ranks NVLS tree from 31457281 B up. The file's
# busbw jumps where that ring starts (4 nodes: 280.30 at 1024 MB, 347.57 at 2048; 8 nodes: 278.15 at 2048,
# 351.32 at 4096; 16 nodes: 306.15 at 4096, 356.27 at 8192).
AWS_TUNER = "https://github.com/aws/aws-ofi-nccl/blob/228fa0eafb41c9e2b46446b86b5ab46c76410650/src/tuner/" \
    "nccl_ofi_regions.cpp"
P5_RING_FROM = ((32, 1610612736), (64, 2684354560), (160, 8053063680), (192, 9663676416))  # (ranks, bytes)


def p5_ring_from(ranks):
    """Bytes from which aws-ofi-nccl's p5 regions run the ring at `ranks` (8 a node, 32 or more): the
    vertices' polyline in log2(size) against log2(ranks), its last segment extended."""
    pts = [(math.log2(r), math.log2(b)) for r, b in P5_RING_FROM]
    y = math.log2(ranks)
    (y0, x0), (y1, x1) = next(((p, q) for p, q in zip(pts, pts[1:]) if y <= q[0]), pts[-2:])
    return 2 ** (x0 + (y - y0) * (x1 - x0) / (y1 - y0))


def p5_pick(nodes, size):
    """aws-ofi-nccl's all-reduce on p5 at 8 GPUs a node, for sizes from 2684354560 B (the figures' 8 GiB):
    NVLS tree on two nodes, else the ring from p5_ring_from(ranks) on, NVLS tree below it."""
    assert size >= 2684354560, "below 2.7 GB the regions hold more algorithms than this reads"
    return "nvls_tree" if nodes == 2 or size < p5_ring_from(8 * nodes) else "ring"


FIGURES += [
    _fig("1 x 8 A100, Azure NDv4", 8, 1, "nvlink3", "hdr", 8, 231.58, AZURE + "ND_A100_v4_results.md",
         "| 8G | 231.58 |"),
    _fig("1 x 8 H200, Azure ND H200v5", 8, 1, "nvlink4", "ndr", 8, 479.98, AZURE + "ND_H200_v5_results.md",
         "| 8G | 479.98 |", nvls=True),
    _fig("1 x 8 A100, AWS p4dn", 8, 1, "nvlink3", "efa", 4, 230.77, "https://github.com/NVIDIA/nccl/issues/527",
         "1   1073741824     268435456     float     sum   8142.6  131.87  230.77", size=1 << 30),
] + [_fig(f"{m} x 8 H100, AWS p5, 32 EFA", 8, m, "nvlink4", "efa", 32, publ, P5, line, nvls=True,
          forced=p5_pick(m, 8 << 30), chosen_by="aws-ofi-nccl")
     for m, publ, line in ((2, 477.71, "2,16,8192,1000,false,254.78,477.71"),
                           (4, 356.99, "4,32,8192,1000,false,184.25,356.99"),
                           (8, 355.36, "8,64,8192,1000,false,180.50,355.36"),
                           (16, 356.27, "16,128,8192,1000,false,179.54,356.27"))]
MISSES += [
    _fig("32 x 8 H100, AWS p5, 32 EFA", 8, 32, "nvlink4", "efa", 32, 321.10, P5,
         "32,256,8192,1000,false,161.18,321.10", nvls=True, forced=p5_pick(32, 8 << 30), chosen_by="aws-ofi-nccl",
         why="aws-ofi-nccl's regions run NVLS tree here (the ring only from about 12.9 GB at 256 ranks); "
             "the same file's NVLS tree runs at 16 and 32 nodes from 2.7 GB up sit under NCCL's own price of "
             "it (306.15 GB/s at 16 nodes and 302.81 at 32, both 4096 MB; 321.10 here, priced 362): nothing "
             "cited prices NVLS tree over EFA"),
]
