"""Which address the ranks reach rank 0 at, and over which interface, without trusting DNS.

torch's store listens on rank 0 and gloo connects every pair of ranks: across nodes both need an address
the other nodes reach. A node's hostname often resolves to nothing (containers) or to 127.0.1.1; so the
ranks tell each other their interfaces over MPI, and rank 0 takes its interface whose subnet holds an
address of every other node (an address no interface of rank 0 holds itself: docker0's 172.17.0.1 is on
every node, and reaches none).
"""
import fcntl
import ipaddress
import os
import socket
import struct

SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B
FIX = "set TUTOR_MASTER_ADDR=<rank 0's IP>, GLOO_SOCKET_IFNAME=<its interface>"


def interfaces():
    """[(name, address, prefix length)] of this machine's IPv4 interfaces that have an address."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFNETMASK, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            found.append((name, addr, ipaddress.ip_network(f"0.0.0.0/{mask}").prefixlen))
    return found


def resolved(hostname):
    """The non-loopback IPv4 address `hostname` resolves to here, or None."""
    try:
        addr = socket.gethostbyname(hostname)
    except OSError:
        return None
    return None if ipaddress.ip_address(addr).is_loopback else addr


def candidates(nodes):
    """rank 0's addresses whose subnet holds an address of every other node. `nodes`: one
    (hostname, interfaces) per rank, rank 0 first."""
    host0, own = nodes[0]
    mine = {addr for _, addr, _ in own}
    others = {}
    for host, ifaces in nodes[1:]:
        if host != host0:
            others[host] = [ipaddress.ip_address(a) for _, a, _ in ifaces if a not in mine]
    found = []
    for _, addr, prefix in own:
        net = ipaddress.ip_network(f"{addr}/{prefix}", strict=False)
        if net.prefixlen < 32 and not net.network_address.is_loopback \
                and all(any(a in net for a in addrs) for addrs in others.values()):
            found.append(addr)
    return found


def choose(nodes, resolve=resolved):
    """rank 0's address the other nodes reach, or None: the one candidate; among several, the one rank
    0's hostname resolves to (else the first); with none, that resolved address (a routed network)."""
    found = candidates(nodes)
    if len(found) == 1:
        return found[0]  # no name lookup: it may wait for a name server that never answers
    hint = resolve(nodes[0][0])
    return hint if hint in found or (hint and not found) else (found[0] if found else None)


def iface_for(addr, ifaces):
    """The name of the interface this machine reaches `addr` over (the kernel's route), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))  # a UDP connect sends nothing: it only picks the route and source
            source = s.getsockname()[0]
    except OSError:
        return None
    for name, a, _ in ifaces:
        if a in (source, addr):
            return name
    return None


def plan(comm, single_node):
    """(store address, this rank's interface for gloo, error line or None). Collective over `comm`.

    One node: loopback. Several: TUTOR_MASTER_ADDR, else the address of GLOO_SOCKET_IFNAME on rank 0,
    else the interface of rank 0 that shares a subnet with every other node (its hostname's address
    first when that is one of them), else its hostname's address when it resolves beyond loopback."""
    if single_node:
        lo = "lo" if os.path.isdir("/sys/class/net/lo") else None
        return "127.0.0.1", os.environ.get("GLOO_SOCKET_IFNAME") or lo, None
    ifaces = interfaces()
    nodes = comm.allgather((socket.gethostname(), ifaces))
    addr = error = None
    if comm.rank == 0:
        named = dict((n, a) for n, a, _ in ifaces).get(os.environ.get("GLOO_SOCKET_IFNAME", ""))
        addr = os.environ.get("TUTOR_MASTER_ADDR") or named or choose(nodes)
        if addr is None:
            error = f"no address of rank 0 ({nodes[0][0]}) that every node reaches: {FIX}"
        elif addr not in {a for _, a, _ in ifaces}:  # the store would listen where no one connects
            error = f"{addr} is no address of rank 0's node {nodes[0][0]}: {FIX}"
    addr, error = comm.bcast((addr, error), root=0)
    if error:
        return None, None, error
    gloo = os.environ.get("GLOO_SOCKET_IFNAME") or iface_for(addr, ifaces)
    fails = comm.allgather(None if gloo else socket.gethostname())
    if any(fails):
        bad = next(f for f in fails if f)
        return None, None, f"no route from {bad} to rank 0's {addr}: {FIX}"
    return addr, gloo, None
