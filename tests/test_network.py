"""Unit: which address of rank 0 the other nodes reach, and the interface gloo takes (common/plumbing/network.py),
without DNS. The two-node runs themselves are in test_two_nodes.py."""
import pytest

from common.plumbing import network

LO = ("lo", "127.0.0.1", 8)
DOCKER = ("docker0", "172.17.0.1", 16)  # the same address on every node: it reaches no other node


def node(host, *ifaces):
    return (host, [LO, DOCKER, *ifaces])


def no_dns(host):
    raise AssertionError(f"looked up {host}: one candidate needs no name server")


def test_the_interface_whose_subnet_holds_the_other_nodes():
    nodes = [node("a", ("eth0", "10.9.0.10", 24)), node("a", ("eth0", "10.9.0.10", 24)),
             node("b", ("ib0", "10.9.0.11", 24)), node("b", ("ib0", "10.9.0.11", 24))]
    assert network.choose(nodes, resolve=no_dns) == "10.9.0.10"


def test_docker0_on_every_node_is_no_route_between_them():
    nodes = [node("a"), node("b")]
    assert network.candidates(nodes) == []
    assert network.choose(nodes, resolve=lambda h: None) is None


def test_only_other_nodes_count():
    # rank 1 shares rank 0's node: its addresses are rank 0's own and prove nothing
    nodes = [node("a", ("eth0", "10.9.0.10", 24), ("eth1", "10.8.0.10", 24)),
             node("a", ("eth0", "10.9.0.10", 24), ("eth1", "10.8.0.10", 24)),
             node("b", ("eth1", "10.8.0.11", 24))]
    assert network.choose(nodes, resolve=no_dns) == "10.8.0.10"


def test_a_subnet_must_hold_every_other_node():
    nodes = [node("a", ("eth0", "10.9.0.10", 24), ("eth1", "10.8.0.10", 24)),
             node("b", ("eth0", "10.9.0.11", 24), ("eth1", "10.8.0.11", 24)),
             node("c", ("eth1", "10.8.0.12", 24))]
    assert network.choose(nodes, resolve=no_dns) == "10.8.0.10"


def test_among_several_the_hostnames_address_else_the_first():
    nodes = [node("a", ("eth0", "10.9.0.10", 24), ("ib0", "10.8.0.10", 24)),
             node("b", ("eth0", "10.9.0.11", 24), ("ib0", "10.8.0.11", 24))]
    assert network.choose(nodes, resolve=lambda h: "10.8.0.10") == "10.8.0.10"
    assert network.choose(nodes, resolve=lambda h: None) == "10.9.0.10"
    assert network.choose(nodes, resolve=lambda h: "192.0.2.5") == "10.9.0.10"


def test_a_routed_network_takes_the_hostnames_address():
    nodes = [node("a", ("eth0", "10.9.0.10", 24)), node("b", ("eth0", "10.7.0.11", 24))]
    assert network.choose(nodes, resolve=lambda h: "10.9.0.10") == "10.9.0.10"
    assert network.choose(nodes, resolve=lambda h: None) is None


def test_resolved_ignores_loopback_and_failures():
    assert network.resolved("localhost") is None  # 127.0.0.1 reaches no other node
    assert network.resolved("no-such-node.invalid") is None


def test_this_machines_interfaces_and_routes():
    ifaces = network.interfaces()
    assert ("lo", "127.0.0.1", 8) in ifaces
    assert network.iface_for("127.0.0.1", ifaces) == "lo"


class FakeComm:
    """One rank's view of an MPI world whose other ranks report `nodes`."""
    def __init__(self, rank, nodes):
        self.rank, self.nodes = rank, nodes

    def allgather(self, value):
        return self.nodes if isinstance(value, tuple) else [value] * len(self.nodes)

    def bcast(self, value, root=0):
        return value


def test_plan_on_one_node_is_loopback(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert network.plan(FakeComm(0, []), single_node=True) == ("127.0.0.1", "lo", None)


def test_plan_with_nothing_that_works_is_one_line_naming_the_fix(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TUTOR_MASTER_ADDR", raising=False)
    monkeypatch.setattr(network, "resolved", lambda host: None)
    monkeypatch.setattr(network, "interfaces", lambda: [LO, DOCKER])
    addr, gloo, error = network.plan(FakeComm(0, [node("a"), node("b")]), single_node=False)
    assert addr is None and "\n" not in error
    assert "TUTOR_MASTER_ADDR" in error and "GLOO_SOCKET_IFNAME" in error


def test_plan_refuses_a_master_address_that_is_not_rank_0s(monkeypatch):
    """torch's store listens on every address of rank 0's node: at another, the others would wait
    for its timeout."""
    monkeypatch.setenv("TUTOR_MASTER_ADDR", "10.9.0.11")  # node b's, not rank 0's
    monkeypatch.setattr(network, "interfaces", lambda: [LO, ("eth0", "10.9.0.10", 24)])
    nodes = [node("a", ("eth0", "10.9.0.10", 24)), node("b", ("eth0", "10.9.0.11", 24))]
    addr, gloo, error = network.plan(FakeComm(0, nodes), single_node=False)
    assert addr is None and "10.9.0.11 is no address of rank 0's node a" in error, error


@pytest.mark.parametrize("env, want", [({"TUTOR_MASTER_ADDR": "127.0.0.1"}, "127.0.0.1"),
                                       ({"GLOO_SOCKET_IFNAME": "lo"}, "127.0.0.1")])
def test_plan_follows_the_settings(monkeypatch, env, want):
    for var in ("GLOO_SOCKET_IFNAME", "TUTOR_MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    addr, gloo, error = network.plan(FakeComm(0, [node("a"), node("b")]), single_node=False)
    assert (addr, gloo, error) == (want, "lo", None)


def test_the_beds_subnet_avoids_every_route_address_and_name_server(monkeypatch):
    from common.runner import testbed
    routes = {("-4", "route", "show", "table", "all"): "default via 192.0.2.1\n10.20.0.0/16 dev x\n",
              ("-4", "-o", "addr"): "2: eth0    inet 10.30.5.7/24 brd 10.30.5.255 scope global eth0\n"}
    monkeypatch.setattr(testbed, "ip", lambda *args, check=True: routes[args])

    class Rng:  # proposes 10.20.1 (in a route), 10.30.5 (an address's subnet), then 10.40.0
        picks = iter([20, 1, 30, 5, 40, 0])

        def randint(self, lo, hi):
            return next(self.picks)
    net = testbed.free_subnet(Rng())
    assert str(net) == "10.40.0.0/24"


@pytest.mark.torch
def test_gloo_gets_the_interface_on_gpu_runs_too(monkeypatch):
    """A GPU run's gloo subgroups (lessons 01, 02) need GLOO_SOCKET_IFNAME as much as a CPU run's."""
    import torch
    import torch.distributed as dist

    from common import bootstrap
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: type("Store", (), {"port": 1})())
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda *a: None)
    ctx = bootstrap.Ctx(lesson="x", comm=FakeComm(0, []), rank=0, world_size=1, local_rank=0, local_size=1,
                        host="h", api="torch", device="gpu", transport="nccl", why="", gpu=0)
    bootstrap.init_torch(ctx)
    assert bootstrap.os.environ.get("GLOO_SOCKET_IFNAME") == "lo"
