"""Command line of the testbed (``hack/testbed.sh``): up, down, run, status.

Owns the mapping from flags to :class:`ringseed.testbed.netns.Testbed`. Rules:

- ``up`` leaves a testbed standing under the fixed prefix ``rstbcli`` (not tied to a pid, so
  stale-run cleanup leaves it alone) and prints its hosts; ``down`` removes it.
- ``run -- CMD...`` builds a testbed, runs CMD on the host machine with the testbed described in
  the environment (``RSTB_ORIGIN=netns:address``, ``RSTB_NODES=netns:address,...``), and removes
  the testbed when CMD ends, fails or is interrupted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

from ringseed.testbed import links, netns

CLI_PREFIX = "rstbcli"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down", "run", "status"])
    parser.add_argument("--nodes", type=int, default=3, help="node hosts (default 3)")
    parser.add_argument("--origin-rate", default="100mbit", help="origin link rate, both directions")
    parser.add_argument("--node-rate", default="1gbit", help="node link rate, both directions")
    parser.add_argument("--mtu", type=int, default=links.DEFAULT_MTU)


def _testbed(args: argparse.Namespace, *, prefix: str | None) -> netns.Testbed:
    return netns.Testbed(
        nodes=args.nodes,
        origin_rate=links.parse_rate(args.origin_rate),
        node_rate=links.parse_rate(args.node_rate),
        mtu=args.mtu,
        prefix=prefix,
    )


def describe(testbed: netns.Testbed) -> dict[str, str]:
    """The environment that tells a command where the testbed's hosts are."""
    return {
        "RSTB_ORIGIN": f"{testbed.origin.netns}:{testbed.origin.address}",
        "RSTB_NODES": ",".join(f"{h.netns}:{h.address}" for h in testbed.nodes),
    }


def _run(args: argparse.Namespace, cmd: Sequence[str]) -> int:
    if not cmd:
        print("testbed run: give a command after --", file=sys.stderr)
        return 2
    with _testbed(args, prefix=None) as testbed:
        return subprocess.run(cmd, env={**os.environ, **describe(testbed)}, check=False).returncode


def run(args: argparse.Namespace, cmd: Sequence[str] = ()) -> int:
    reason = netns.can_run()
    if reason is not None:
        print(f"testbed: {reason}", file=sys.stderr)
        return 1
    if args.action == "down":
        print("removed:", " ".join(netns.clean_mine(CLI_PREFIX)) or "nothing")
        return 0
    if args.action == "status":
        print("\n".join(n for n in netns.list_namespaces() if n.startswith(netns.PREFIX)) or "no testbed")
        return 0
    if args.action == "run":
        return _run(args, cmd)
    netns.clean_mine(CLI_PREFIX)
    testbed = _testbed(args, prefix=CLI_PREFIX).up()
    for host in testbed.hosts:
        print(f"{host.name:<8} {host.address:<12} ip netns exec {host.netns} ...")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/testbed.sh", description=__doc__.splitlines()[0])
    configure(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return run(parser.parse_args(argv[:split]), argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
