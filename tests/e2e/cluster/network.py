"""The cluster's network: the testbed's hosts as nodes, each with a pod bridge, and one netns per pod.

Owns the namespaces, links and routes of the emulated cluster (test harness, not product code).
Built on :class:`ringseed.testbed.netns.Testbed`, so node links are shaped with ``tc`` exactly as on
the testbed (``tbf`` on the node's ``eth0`` and on the bridge-side veth, both directions). Layout,
as a routed pod network (kubenet style) would be:

- the testbed's ``origin`` host (``10.77.0.1``) is the control plane's host: the API server's TLS
  front listens there;
- node ``i`` is the testbed host ``node<i>`` (``10.77.1.<i+1>``) with a bridge ``cbr0`` holding
  ``10.78.<i>.1/24``, its pod network; it forwards between ``cbr0`` and its shaped ``eth0``;
- each pod gets a netns of its own (``<prefix>-p<k>``, so the testbed's stale clean-up covers it)
  with ``eth0`` on its node's ``cbr0`` and an address from the node's /24; every host routes each
  node's /24 through that node, so pod-to-pod traffic across nodes crosses both nodes' shaped
  links, and traffic inside a node does not.

Containers join a pod's netns with ``--network ns:/run/netns/<name>``. :func:`socket_in` makes a
socket inside a netns for the harness itself (probes, the API server's front), leaving the test
process's own namespace untouched.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field

from ringseed.testbed import netns

POD_SUBNET = "10.78"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_setns_lock = threading.Lock()


def _run(args: list[str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise netns.TestbedError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")


@dataclass(frozen=True)
class PodNet:
    """A pod's network namespace and address."""

    netns: str
    address: str
    node: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"


@dataclass
class ClusterNetwork:
    """A testbed of ``nodes`` node hosts with pod networks; use as a context manager."""

    nodes: int
    node_rate: float | None = None
    testbed: netns.Testbed = field(init=False)
    _pods: dict[str, PodNet] = field(default_factory=dict, init=False)
    _next_ip: dict[int, itertools.count[int]] = field(default_factory=dict, init=False)
    _pod_counter: itertools.count[int] = field(default_factory=itertools.count, init=False)

    def __post_init__(self) -> None:
        self.testbed = netns.Testbed(nodes=self.nodes, origin_rate=None, node_rate=self.node_rate)

    @property
    def control_address(self) -> str:
        return self.testbed.origin.address

    def node_names(self) -> list[str]:
        return [host.name for host in self.testbed.nodes]

    def node_address(self, node: str) -> str:
        return self._host(node).address

    def _host(self, node: str) -> netns.Host:
        for host in self.testbed.nodes:
            if host.name == node:
                return host
        raise KeyError(f"no node {node!r}")

    def up(self) -> ClusterNetwork:
        self.testbed.up()
        try:
            for index, host in enumerate(self.testbed.nodes):
                gateway = f"{POD_SUBNET}.{index}.1"
                _run(["ip", "-n", host.netns, "link", "add", "cbr0", "mtu", str(self.testbed.mtu), "type", "bridge"])
                _run(["ip", "-n", host.netns, "addr", "add", f"{gateway}/24", "dev", "cbr0"])
                _run(["ip", "-n", host.netns, "link", "set", "cbr0", "up"])
                _run(["ip", "netns", "exec", host.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
                self._next_ip[index] = itertools.count(2)
            for host in self.testbed.hosts:
                for index, node in enumerate(self.testbed.nodes):
                    if node is not host:
                        _run(
                            ["ip", "-n", host.netns, "route", "add", f"{POD_SUBNET}.{index}.0/24", "via", node.address]
                        )
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for pod in list(self._pods):
            self.remove_pod(pod)
        self.testbed.down()
        netns.clean_mine(self.testbed.prefix)

    def __enter__(self) -> ClusterNetwork:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def add_pod(self, key: str, *, node: str) -> PodNet:
        """A fresh netns for pod ``key`` on ``node``, wired to the node's pod bridge."""
        host = self._host(node)
        index = self.testbed.nodes.index(host)
        number = next(self._pod_counter)
        octet = next(self._next_ip[index])
        if octet > 254:
            raise netns.TestbedError(f"node {node} ran out of pod addresses")
        pod = PodNet(netns=f"{self.testbed.prefix}-p{number}", address=f"{POD_SUBNET}.{index}.{octet}", node=node)
        port, mtu = f"p{number}", str(self.testbed.mtu)
        _run(["ip", "netns", "add", pod.netns])
        try:
            _run(
                [
                    "ip",
                    "-n",
                    host.netns,
                    "link",
                    "add",
                    port,
                    "mtu",
                    mtu,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "mtu",
                    mtu,
                    "netns",
                    pod.netns,
                ]
            )
            _run(["ip", "-n", host.netns, "link", "set", port, "master", "cbr0", "up"])
            _run(["ip", "-n", pod.netns, "addr", "add", f"{pod.address}/24", "dev", "eth0"])
            _run(["ip", "-n", pod.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", pod.netns, "link", "set", "lo", "up"])
            _run(["ip", "-n", pod.netns, "route", "add", "default", "via", f"{POD_SUBNET}.{index}.1"])
        except BaseException:
            netns.delete_namespace(pod.netns)
            raise
        self._pods[key] = pod
        return pod

    def remove_pod(self, key: str) -> None:
        pod = self._pods.pop(key, None)
        if pod is not None:
            netns.delete_namespace(pod.netns)  # its veth goes with it

    def set_link(self, node: str, *, up: bool) -> None:
        """Cut (``up=False``) or restore a node's only link, at the switch's end: the node keeps its
        address and routes and its packets vanish, as when a cable or a switch port fails."""
        port = f"v{self.testbed.hosts.index(self._host(node))}"  # the testbed's name for it
        _run(["ip", "-n", self.testbed.bridge, "link", "set", port, "up" if up else "down"])


def socket_in(netns_name: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket created inside network namespace ``netns_name`` (it stays there for its life).

    The calling thread enters the namespace with ``setns(2)`` and returns to its own before this
    returns; a lock keeps two threads from doing it at once."""
    with _setns_lock, open("/proc/thread-self/ns/net", "rb") as own, open(f"/run/netns/{netns_name}", "rb") as target:
        if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns_name}: {os.strerror(ctypes.get_errno())}")
        try:
            return socket.socket(family, kind)
        finally:
            if _libc.setns(own.fileno(), CLONE_NEWNET) != 0:  # pragma: no cover - would leave the thread astray
                raise OSError(ctypes.get_errno(), "setns back into the thread's own netns failed")
