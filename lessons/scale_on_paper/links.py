"""Lesson 16's cluster on paper: link classes from data sheets, collectives priced by lesson 07's
alpha-beta formulas, and the published figures the prices are checked against.

    Cluster(gpus_per_node, nodes, intra, nic, nics_per_node, links)   one GPU's links, one direction, B/s
    ring(n, nbytes, alpha, bw, calls)  lesson 07's ring all-reduce, nbytes in all over `calls` calls
    ring_time(cluster, nbytes, calls)  NCCL's ring over every rank of a cluster
    nvls_time(cluster, nbytes)      NVSwitch reduces in the switch: each GPU moves (n+1)/n of the buffer
    two_level(cluster, nbytes, calls)  the hierarchy: reduce-scatter in the node, all-reduce across, all-gather
    price(figure)                   its busbw: common/bandwidth.py's, nccl-tests' all-reduce factor 2(n-1)/n
    FIGURES, MISSES                 published all-reduce busbw, each with its address and the phrase read

Every number below was read at the address beside it (the results JSON keeps each); nothing here
is fitted to the figures it is checked against. One protocol efficiency serves every link class.
"""
import math
from dataclasses import dataclass

from common import bandwidth

GB = 1e9
# the one efficiency: NCCL's maintainer, on 8 x H100: "450GB/s is the line rate. With the protocol
# overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s"
# (https://github.com/NVIDIA/nccl-tests/issues/212). That H100 ring figure is therefore not a check.
EFFICIENCY = 370 / 450
EFFICIENCY_SOURCE = "https://github.com/NVIDIA/nccl-tests/issues/212"

# link classes: bandwidth per GPU in ONE direction (a data sheet's NVLink figure is both directions:
# "900 GB/s is the sum of both directions, at the wire speed", https://github.com/NVIDIA/nccl/issues/1442)
LINKS = {
    "nvlink4": dict(GBps=900 / 2, alpha_us=2.0, what="NVLink 4 (H100, H200)",
                    source="https://glennklockwood.com/garden/processors/h100 (H100); https://semifly.ai/articles/"
                           "why-nvidia-h200-and-nccl-are-reshaping-ai-training-efficiency-at-scale (H200)"),
    "nvlink3": dict(GBps=600 / 2, alpha_us=2.0, what="NVLink 3 (A100)",
                    source="https://www.nvidia.com/de-de/data-center/nvlink/"),
    "nvlink3_a800": dict(GBps=400 / 2, alpha_us=2.0, what="NVLink 3 capped (A800)",
                         source="https://tweakers.net/nieuws/203182/nvidia-introduceert-a800-gpu-voor-china-"
                                "die-niet-onder-exportrestricties-vs-valt.html"),
    # a NIC's Gb/s is each way, as NCCL's maintainers read it ("24GB/s is the peak performance per 200G NIC")
    "ndr": dict(GBps=400 / 8, alpha_us=5.0, what="InfiniBand NDR / 400GbE (ConnectX-7)",
                source="https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction"),
    "hdr": dict(GBps=200 / 8, alpha_us=5.0, what="InfiniBand HDR (ConnectX-6)",
                source="https://lenovopress.lenovo.com/lp1195"),
}
# latencies: the upper end of "~1-2 us" (NVLink 4) and "~1-5 us" (InfiniBand NDR) read at
# https://fridayswithfaraday.com/posts/gpu-hw-nvlink-nvswitch-interconnect ; at the sizes below
# (GiBs) they change no busbw by 1%.
ALPHA_SOURCE = "https://fridayswithfaraday.com/posts/gpu-hw-nvlink-nvswitch-interconnect"


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
        return (self.links or LINKS)[link]["GBps"] * GB * EFFICIENCY  # B/s the protocol gets out of one link

    def alpha(self, link):
        return (self.links or LINKS)[link]["alpha_us"] * 1e-6


def specs(c):
    """Cluster c's shape and raw link specs, as a results row reports them (the runner prices from them)."""
    table = c.links or LINKS
    return dict(gpus_per_node=c.gpus_per_node, nodes=c.nodes, nics_per_node=c.nics_per_node,
                intra_GBps=table[c.intra]["GBps"], nic_GBps=table[c.nic]["GBps"],
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


def nvls_time(c, nbytes):
    """NVLink SHARP in one node: each GPU reads-and-reduces its 1/n through the switch and multicasts
    it back, so its link carries n/n + 1/n of the buffer each way: (n+1)/n * nbytes, in one alpha."""
    return c.alpha(c.intra) + (c.n + 1) / c.n * nbytes / c.bw(c.intra)


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


def price(row):
    """The predicted busbw of one figure's row, GB/s (per NIC where the figure is per NIC)."""
    c = Cluster(row["gpus_per_node"], row["nodes"], row["intra"], row["nic"], row["nics_per_node"])
    t = nvls_time(c, row["size"]) if row["algo"] == "nvls" else ring_time(c, row["size"])
    return bandwidth.busbw("allreduce", row["size"], t, c.n) / (row["nics_per_node"] if row["per_nic"] else 1)


def _fig(label, gpn, nodes, intra, nic, nics, algo, published, source, phrase, size=8 << 30, per_nic=False):
    return dict(label=label, gpus_per_node=gpn, nodes=nodes, intra=intra, nic=nic, nics_per_node=nics,
                algo=algo, size=size, per_nic=int(per_nic), published=published, source=source, phrase=phrase)


# all-reduce busbw (GB/s) published for real machines: NCCL's maintainers, or users' nccl-tests output
FIGURES = [
    _fig("1 x 8 A100, NVSwitch, ring", 8, 1, "nvlink3", "hdr", 4, "ring", 240,
         "https://github.com/NVIDIA/nccl/issues/1712",
         "your GPUs are NVLink-connected, so you should be seeing close to 240 GB/s in that case"),
    _fig("1 x 8 A800, NVSwitch, ring", 8, 1, "nvlink3_a800", "hdr", 1, "ring", 160,
         "https://github.com/NVIDIA/nccl/issues/412",
         "you should get ~160GB/s  intra-node and 24GB/s inter-node"),
    _fig("12 x 8 A800, 1 HDR NIC per node", 8, 12, "nvlink3_a800", "hdr", 1, "ring", 24,
         "https://github.com/NVIDIA/nccl/issues/412",
         "you should get ~160GB/s  intra-node and 24GB/s inter-node"),
    # a peak per NIC, said of a run up to 128 MB: priced, like the others, at 8 GiB
    _fig("3 x 8 A100, 4 HDR NICs per node", 8, 3, "nvlink3", "hdr", 4, "ring", 96,
         "https://github.com/NVIDIA/nccl-tests/issues/119",
         "24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs), so in your case 96GB/s is "
         "the target"),
    # nodes not said: 2 priced (at 8 GiB, 2 to 16 nodes move a ring's busbw by 1% at most)
    _fig("DGX A100, 8 HDR NICs per node", 8, 2, "nvlink3", "hdr", 8, "ring", 192,
         "https://github.com/NVIDIA/nccl/issues/812",
         "On an Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW"),
    _fig("2 x 8 H100, NDR 400G, per NIC", 8, 2, "nvlink4", "ndr", 8, "ring", 47,
         "https://github.com/NVIDIA/nccl-tests/issues/290",
         "For NDR @ 400Gbps you should see 46-48GB/s per NIC", per_nic=True),
    _fig("4 x 8 H100, 8 x 400G RoCE", 8, 4, "nvlink4", "ndr", 8, "ring", 320,
         "https://github.com/NVIDIA/nccl/issues/1221",
         "same busbw 320GB"),  # of 4 nodes "(GPU 8xH100, NIC: 8x400Gb RoCE)", NVLS on or off
]
# what the model misses, and is said to miss: NVLink SHARP, where the switch itself reduces
MISSES = [
    _fig("1 x 8 H100, NVLink SHARP", 8, 1, "nvlink4", "ndr", 8, "nvls", 480,
         "https://github.com/NVIDIA/nccl-tests/issues/212",
         "On 8 GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)"),
    _fig("1 x 8 H200, NVLink SHARP", 8, 1, "nvlink4", "ndr", 8, "nvls", 475,
         "https://github.com/NVIDIA/nccl-tests/issues/272",
         "The output shows peak bandwidth of 475 GB/s"),
]
