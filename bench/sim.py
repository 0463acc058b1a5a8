"""Swarm simulator scenarios: calibration against the testbed, and 500 GB at 100 to 10,000 nodes.

    .venv/bin/python -m bench.sim [--quick] [--only calibration|classic|default] [--json OUT]

- calibration: the testbed's setting (256 MiB, 64 MiB chunks, B_o 100 Mbit/s, B_l 1 Gbit/s,
  N = 4, 8, 16; link rates times the TCP share at MTU 9000), to compare with
  ``bench/testbed_distribution.py``'s measured T: once with ideal agents, once with the agent
  overheads the testbed shows (``TESTBED_AGENTS``).
- classic: 500 GB, 10 Gbit/s origin and nodes, 1 GB chunks (T* = 408 s at N = 1,000),
  N = 100, 1,000, 10,000, 1% of the nodes failing between 0.2 T* and 0.6 T*.
- default: the same with ringseed's default chunk (64 MiB).

Approximation, printed on every line it applies to: where N x chunks exceeds ``--budget``
chunk transfers, two prefixes of K and 2K chunks are simulated (all N nodes, links, failures)
and T is extrapolated linearly: T = T(2K) + (C - 2K) x max(slope, chunk/B_o), slope =
(T(2K) - T(K)) / K, i.e. the swarm is assumed to keep the per-chunk pace it had over the
second prefix. ``--prefix K`` sets K; with ``--single`` one prefix of K chunks is simulated and
the rest is assumed to leave at the origin's pace (``Scenario.prefix_chunks``). ``--nodes``
picks N. ``--quick`` lowers the budget and drops N = 10,000. ``--validate`` compares the
approximation with exact runs at N = 100 and 1,000 (1 GB chunks). ``--heartbeat-rate R`` gives
the tracker a pacing budget (a node announces no sooner than the gap it names; ``--front-seats``
how many nodes at the pipeline's front keep the short gap).

Every node is ringseed's own agent core and the master is ringseed's own tracker
(:mod:`ringseed.sim.swarm`); the cost is about ten core ticks and a dozen tracker calls per
chunk transfer, so an exact 500 GB run at N = 1,000 (500,000 transfers) is out of reach of one
core in minutes: the big rows are prefix runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ringseed.sim import scenario, swarm
from ringseed.testbed import links

GBIT = 1e9 / 8
MiB = 1 << 20


def run(config: scenario.Scenario, *, budget: int, prefix: int | None = None, single: bool = False) -> dict[str, Any]:
    """Simulate exactly, or by two prefixes and a linear extrapolation when too large (``prefix``
    sets K; ``single``: one prefix of K chunks, the rest at the origin's pace)."""
    chunks = config.chunks
    if prefix is None and config.nodes * chunks <= budget:
        result = swarm.simulate(config)
        return _row(config, result.seconds, result, note="exact")
    k = prefix if prefix is not None else max(4, min(1000, budget // (2 * config.nodes)))
    if single:
        result = swarm.simulate(_prefix(config, k))
        pace = config.chunk_bytes / config.origin_rate
        note = f"approx: prefix of {k} of {chunks} chunks, the rest at B_o ({pace:.3f} s/chunk)"
        return _row(config, result.seconds, result, note=note)
    short = swarm.simulate(_prefix(config, k))
    long = swarm.simulate(_prefix(config, 2 * k))
    slope = max((long.simulated_seconds - short.simulated_seconds) / k, config.chunk_bytes / config.origin_rate)
    seconds = long.simulated_seconds + (chunks - 2 * k) * slope
    note = f"approx: prefixes of {k} and {2 * k} of {chunks} chunks, linear extrapolation ({slope:.3f} s/chunk)"
    return _row(config, seconds, long, note=note, wall=short.wall_seconds + long.wall_seconds)


def _prefix(config: scenario.Scenario, k: int) -> scenario.Scenario:
    values = {f: getattr(config, f) for f in config.__dataclass_fields__}
    values["prefix_chunks"] = k
    return scenario.Scenario(**values)


def _row(
    config: scenario.Scenario, seconds: float, result: scenario.Result, *, note: str, wall: float | None = None
) -> dict[str, Any]:
    bound = scenario.bound(config)
    return {
        "nodes": config.nodes,
        "chunk": config.chunk_bytes,
        "model": config.model_bytes,
        "seconds": seconds,
        "bound": bound,
        "ratio": seconds / bound,
        "failed": result.failed,
        "completed": result.completed,
        "wall": wall if wall is not None else result.wall_seconds,
        "note": note,
        "origin_ratio": result.origin_ratio,
        "ticks": result.ticks,
        "reports": result.reports,
        "penalised_liars": result.penalised_liars,
        "penalised_honest": result.penalised_honest,
        "transfers": result.transfers,
    }


# Agent overheads seen on the testbed (bench.testbed_distribution's timeline): the first origin
# chunks land about 0.3 s late (listing, publishing, claiming); a 64 MiB chunk is hashed and
# stored in about 0.3 s on these cores.
TESTBED_AGENTS = scenario.Agents(start_delay=0.3, process_delay=0.3)


def calibration() -> list[scenario.Scenario]:
    share = links.goodput_fraction()
    return [
        scenario.Scenario(
            model_bytes=256 * MiB,
            chunk_bytes=64 * MiB,
            nodes=n,
            origin_rate=0.1 * GBIT * share,
            node_up=GBIT * share,
            node_down=GBIT * share,
            agents=agents,
        )
        for agents in (scenario.Agents(), TESTBED_AGENTS)
        for n in (4, 8, 16)
    ]


def big(*, chunk: int, quick: bool, nodes: tuple[int, ...] | None = None) -> list[scenario.Scenario]:
    sizes = nodes or ((100, 1000) if quick else (100, 1000, 10_000))
    return [
        scenario.Scenario(
            model_bytes=500 * 10**9,
            chunk_bytes=chunk,
            nodes=n,
            origin_rate=10 * GBIT,
            node_up=10 * GBIT,
            node_down=10 * GBIT,
            fail_fraction=0.01,
        )
        for n in sizes
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("calibration", "classic", "default"), default=None)
    parser.add_argument("--budget", type=int, default=None, help="exact runs up to this many chunk transfers")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--validate", action="store_true", help="exact vs prefix approximation, classic N=100, 1000")
    parser.add_argument("--upload-slots", type=int, default=None, help="agent upload slots (default: the agent's)")
    parser.add_argument("--origin-depth", type=int, default=None, help="origin pulls at once (default: the agent's)")
    parser.add_argument("--nodes", default=None, help="comma-separated N for classic/default (default 100,1000,10000)")
    parser.add_argument("--prefix", type=int, default=None, help="simulate prefixes of K and 2K chunks (K: this)")
    parser.add_argument("--single", action="store_true", help="with --prefix: one prefix, rest at B_o")
    parser.add_argument("--liars", type=int, default=0, help="nodes serving corrupt bytes (trust)")
    parser.add_argument("--bad-ram", type=int, default=0, help="nodes receiving every chunk corrupted (trust)")
    parser.add_argument(
        "--heartbeat-rate", type=float, default=None, help="the tracker's pacing budget, heartbeats/s (default: none)"
    )
    parser.add_argument("--front-seats", type=int, default=None, help="paced: front seats (default: the tracker's)")
    args = parser.parse_args()
    nodes = tuple(int(n) for n in args.nodes.split(",")) if args.nodes else None
    if args.validate:
        return validate()
    budget = args.budget or (20_000 if args.quick else 1_000_000)
    groups = {
        "calibration": calibration(),
        "classic": big(chunk=10**9, quick=args.quick, nodes=nodes),
        "default": big(chunk=64 * MiB, quick=args.quick, nodes=nodes),
    }
    rows = []
    print(f"{'group':<12} {'N':>6} {'chunk':>9} {'T s':>9} {'T* s':>9} {'T/T*':>6} {'failed':>6} {'wall s':>7}  note")
    for name, configs in groups.items():
        if args.only and name != args.only:
            continue
        for config in configs:
            config = _override(config, upload_slots=args.upload_slots, origin_slots=args.origin_depth)
            config = _override(config, heartbeat_rate=args.heartbeat_rate, front_seats=args.front_seats)
            config = dataclasses.replace(config, liars=args.liars, bad_ram=args.bad_ram)
            prefix = args.prefix if name != "calibration" else None
            row = {"group": name, **run(config, budget=budget, prefix=prefix, single=args.single)}
            rows.append(row)
            chunk = f"{config.chunk_bytes / MiB:.0f}MiB" if config.chunk_bytes < 10**9 else "1GB"
            if config.agents.process_delay:
                row["note"] += " (agent delays: start 0.3 s, verify+store 0.3 s)"
            print(
                f"{name:<12} {config.nodes:>6} {chunk:>9} {row['seconds']:>9.1f} {row['bound']:>9.1f} "
                f"{row['ratio']:>6.3f} {row['failed']:>6} {row['wall']:>7.1f}  {row['note']}",
                flush=True,
            )
            if config.liars or config.bad_ram:
                print(
                    f"{'':<12} trust: {row['reports']} reports; penalised {row['penalised_liars']} of"
                    f" {config.liars} liars and {row['penalised_honest']} honest nodes",
                    flush=True,
                )
    _growth(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _override(config: scenario.Scenario, **agents: float | None) -> scenario.Scenario:
    changes = {k: v for k, v in agents.items() if v is not None}
    if not changes:
        return config
    return dataclasses.replace(config, agents=dataclasses.replace(config.agents, **changes))


def validate() -> int:
    """The prefix approximation against exact runs (classic scenario, 100 and 1,000 nodes)."""
    print(f"{'N':>6} {'exact T s':>10} {'approx T s':>10} {'error':>7}  note")
    for config in big(chunk=10**9, quick=True):
        exact = run(config, budget=10**9)
        for per_node in (100, 200):  # prefixes of 50/100 chunks (as at N = 10,000) and of 100/200
            approx = run(config, budget=per_node * config.nodes)
            error = approx["seconds"] / exact["seconds"] - 1
            print(f"{config.nodes:>6} {exact['seconds']:>10.1f} {approx['seconds']:>10.1f} {error:>+7.1%}  "
                  f"{approx['note']}")  # fmt: skip
    return 0


def _growth(rows: list[dict[str, Any]]) -> None:
    """How T grows with N within each group: T(N) - T(N_min) against the bound's log2 term."""
    for name in ("classic", "default"):
        group = sorted((r for r in rows if r["group"] == name), key=lambda r: r["nodes"])
        if len(group) < 2:
            continue
        base = group[0]
        steps = ", ".join(
            f"N={r['nodes']}: {r['seconds'] - base['seconds']:+.1f} s (log2 term {_hops(base, r):+.1f} s)"
            for r in group[1:]
        )
        print(f"growth {name}: vs N={base['nodes']}: {steps}")


def _hops(base: dict[str, Any], row: dict[str, Any]) -> float:
    extra = math.ceil(math.log2(row["nodes"])) - math.ceil(math.log2(base["nodes"]))
    return float(extra * row["chunk"] / (10 * GBIT))


if __name__ == "__main__":
    raise SystemExit(main())
