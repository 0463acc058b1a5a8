"""Network-namespace testbed: an origin host and N node hosts on one bridge, links limited by tc.

Owns the life cycle of the namespaces it makes and nothing else. Rules:

- Every object lives inside namespaces this module creates: the bridge sits in its own
  namespace, each veth pair is created there with its other end moved straight into a host
  namespace, so the host's root namespace (its interfaces, routes and addresses) is never
  touched and no packet can leave the testbed.
- Names carry a prefix with the creating process's pid (``rstb<pid>x<k>-...``), so parallel runs
  never collide and a later run can remove what a crashed run left behind (only namespaces
  whose pid is no longer alive).
- Each link is shaped in both directions (full duplex): ``tc tbf`` on the host's ``eth0``
  limits what the host sends, ``tc tbf`` on the bridge-side veth limits what it receives.
- :class:`Testbed` is a context manager: on exit, also after an error, Ctrl-C or SIGTERM, it
  kills the processes still running inside its namespaces and deletes the namespaces.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from ringseed.testbed import links

PREFIX = "rstb"
SUBNET = "10.77"
_counter = itertools.count()


class TestbedError(RuntimeError):
    """A namespace, link or shaping command failed; the message names the command."""


@dataclass(frozen=True)
class Host:
    """One host of the testbed: a network namespace with one shaped interface."""

    name: str
    netns: str
    address: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` wrapped so that they run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``args`` inside this host (``subprocess.Popen`` keyword arguments pass through)."""
        return subprocess.Popen(self.command(args), **kwargs)

    def run(self, args: Sequence[str], *, timeout: float = 60.0, check: bool = True) -> str:
        """Run ``args`` inside this host to completion and return its stdout."""
        done = subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise TestbedError(f"{' '.join(args)} on {self.name} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout


def _ip(args: Sequence[str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestbedError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def list_namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    out = _ip(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _owner_pid(netns: str) -> int | None:
    if not netns.startswith(PREFIX):
        return None
    digits = netns[len(PREFIX) :].split("x", 1)[0]
    return int(digits) if digits.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_namespace(netns: str) -> None:
    """Kill the processes inside ``netns`` (which this testbed started) and delete it."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)


def clean_stale() -> list[str]:
    """Delete testbed namespaces left by processes that no longer run; returns their names."""
    stale = [n for n in list_namespaces() if (pid := _owner_pid(n)) is not None and not _alive(pid)]
    for netns in stale:
        delete_namespace(netns)
    return stale


def clean_mine(prefix: str) -> list[str]:
    """Delete every namespace whose name starts with ``prefix``; returns their names."""
    mine = [n for n in list_namespaces() if n.startswith(prefix)]
    for netns in mine:
        delete_namespace(netns)
    return mine


def can_run() -> str | None:
    """None when a testbed can be built here, else the reason it cannot (for pytest skips)."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            return f"{tool} not available"
    return None


class Testbed:
    """An origin host and ``nodes`` node hosts on a bridge; use as a context manager.

    ``origin_rate`` and ``node_rate`` are link rates in bit/s (None: unshaped), applied in both
    directions of the host's link. Addresses: origin ``10.77.0.1``, node i ``10.77.1.(i+1)``
    (i < 250), all on one /16 that exists only inside the testbed.
    """

    def __init__(
        self,
        *,
        nodes: int,
        origin_rate: float | None,
        node_rate: float | None,
        mtu: int = links.DEFAULT_MTU,
        prefix: str | None = None,
    ) -> None:
        if not 1 <= nodes <= 250:
            raise ValueError(f"nodes must be 1..250, got {nodes}")
        self.prefix = prefix or f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.bridge = f"{self.prefix}-br"
        self.origin = Host(name="origin", netns=f"{self.prefix}-o", address=f"{SUBNET}.0.1")
        self.nodes = [
            Host(name=f"node{i}", netns=f"{self.prefix}-n{i}", address=f"{SUBNET}.1.{i + 1}") for i in range(nodes)
        ]
        self.rates: Mapping[str, float | None] = {"origin": origin_rate, **{h.name: node_rate for h in self.nodes}}
        self.mtu = mtu
        self._old_sigterm: Any = None

    @property
    def hosts(self) -> list[Host]:
        return [self.origin, *self.nodes]

    def up(self) -> Testbed:
        """Create the bridge, the hosts, their links and shaping (cleans up on failure)."""
        clean_stale()
        try:
            _ip(["ip", "netns", "add", self.bridge])
            _ip(["ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge"])
            _ip(["ip", "-n", self.bridge, "link", "set", "br0", "up"])
            for index, host in enumerate(self.hosts):
                self._add_host(index, host)
        except BaseException:
            self.down()
            raise
        return self

    def _add_host(self, index: int, host: Host) -> None:
        port = f"v{index}"
        _ip(["ip", "netns", "add", host.netns])
        _ip(["ip", "-n", self.bridge, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
             "peer", "name", "eth0", "mtu", str(self.mtu), "netns", host.netns])  # fmt: skip
        _ip(["ip", "-n", self.bridge, "link", "set", port, "master", "br0", "up"])
        _ip(["ip", "-n", host.netns, "addr", "add", f"{host.address}/16", "dev", "eth0"])
        _ip(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        _ip(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        rate = self.rates[host.name]
        if rate is not None:
            _ip(["tc", "-n", host.netns, "qdisc", "add", "dev", "eth0", "root", *links.tbf_args(rate_bps=rate)])
            _ip(["tc", "-n", self.bridge, "qdisc", "add", "dev", port, "root", *links.tbf_args(rate_bps=rate)])

    def down(self) -> None:
        """Kill what runs inside the testbed and delete its namespaces (safe to call twice)."""
        for netns in [h.netns for h in self.hosts] + [self.bridge]:
            delete_namespace(netns)

    def __enter__(self) -> Testbed:
        self._old_sigterm = _install_sigterm()
        return self.up()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.down()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)

    def processes(self) -> Iterator[int]:
        """Pids of the processes running inside the testbed's hosts."""
        for host in self.hosts:
            out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=False)
            yield from (int(p) for p in out.stdout.split() if p.isdigit())


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _install_sigterm() -> Any:
    """Turn SIGTERM into KeyboardInterrupt (main thread only), so that ``__exit__`` cleans up."""
    try:
        return signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: leave signals alone
        return None
