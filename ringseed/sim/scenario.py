"""Scenarios and results of the swarm simulator, and the lower bound T* it is judged against.

Owns the values (frozen dataclasses) and the bound; no simulation here. Rules:

- Rates are bytes per second, sizes bytes, times seconds.
- ``T* = S / B_o + ceil(log2 N) * chunk / B_l``: the origin must send the model once, and the
  last chunk still needs ``ceil(log2 N)`` store-and-forward doublings on node links after that.
- ``prefix_chunks`` asks for the stated approximation used where an exact run is too large:
  simulate only the model's first K chunks (with all N nodes, links and failures) and add
  ``(C - K) * chunk / B_o`` for the rest, i.e. assume the swarm keeps pace with the origin
  once its pipeline is full. :func:`describe` says so in every printed line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ringseed.protocol import pacing

GB = 10**9
MiB = 1 << 20


@dataclass(frozen=True)
class Agents:
    """The agent's settings (its defaults; see ringseed/agent) and the delays the simulation adds."""

    download_slots: int = 4
    upload_slots: int = 4
    origin_slots: int = 1  # the agent's origin depth
    retry_after: float = 0.1
    process_delay: float = 0.0
    start_delay: float = 0.0
    offline_after: float = 10.0
    heartbeat_interval: float = 1.0
    stream_slots: int = 8
    heartbeat_rate: float | None = None  # the tracker's pacing budget (None: announcements go at once)
    early_gap: float = pacing.DEFAULT_GAP  # the least gap between a node's announcements in a small swarm (paced)
    front_seats: int = pacing.DEFAULT_FRONT_SEATS  # nodes at the pipeline's front that keep the base gap (paced)


@dataclass(frozen=True)
class Scenario:
    """One simulated distribution."""

    model_bytes: int
    chunk_bytes: int
    nodes: int
    origin_rate: float
    node_up: float
    node_down: float
    fail_fraction: float = 0.0
    fail_window: tuple[float, float] = (0.2, 0.6)
    agents: Agents = field(default_factory=Agents)
    prefix_chunks: int | None = None
    seed: int = 1
    liars: int = 0  # nodes that serve corrupt bytes
    bad_ram: int = 0  # nodes that receive every chunk corrupted (and so report honest peers)

    @property
    def chunks(self) -> int:
        return max(1, math.ceil(self.model_bytes / self.chunk_bytes))

    @property
    def simulated_chunks(self) -> int:
        return self.chunks if self.prefix_chunks is None else min(self.chunks, self.prefix_chunks)

    @property
    def failures(self) -> int:
        return int(self.nodes * self.fail_fraction)


@dataclass(frozen=True)
class Result:
    """What one run measured."""

    scenario: Scenario
    seconds: float
    simulated_seconds: float
    bound: float
    origin_bytes: int
    completed: int
    failed: int
    transfers: int
    wall_seconds: float
    p50_seconds: float
    reports: int = 0  # bad chunks reported to the tracker
    penalised_liars: int = 0
    penalised_honest: int = 0
    ticks: int = 0  # agent core ticks (the simulation's work)

    @property
    def ratio(self) -> float:
        return self.seconds / self.bound

    @property
    def origin_ratio(self) -> float:
        return self.origin_bytes / self.scenario.model_bytes


def t_star(*, model_bytes: int, chunk_bytes: int, nodes: int, origin_rate: float, node_rate: float) -> float:
    """The lower bound ``S/B_o + ceil(log2 N) * chunk/B_l`` in seconds."""
    hops = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    return model_bytes / origin_rate + hops * min(chunk_bytes, model_bytes) / node_rate


def bound(scenario: Scenario) -> float:
    """T* for a scenario (node rate: the smaller of its up and down rates)."""
    return t_star(
        model_bytes=scenario.model_bytes,
        chunk_bytes=scenario.chunk_bytes,
        nodes=scenario.nodes,
        origin_rate=scenario.origin_rate,
        node_rate=min(scenario.node_up, scenario.node_down),
    )


def describe(scenario: Scenario) -> str:
    """One line naming the scenario and any approximation in force."""
    text = (
        f"S={scenario.model_bytes / GB:g} GB chunk={scenario.chunk_bytes / MiB:g} MiB N={scenario.nodes} "
        f"B_o={scenario.origin_rate * 8 / 1e9:g} Gbit/s B_l={scenario.node_down * 8 / 1e9:g} Gbit/s "
        f"fail={scenario.fail_fraction:.0%}"
    )
    if scenario.simulated_chunks < scenario.chunks:
        text += (
            f" [approx: first {scenario.simulated_chunks} of {scenario.chunks} chunks simulated,"
            f" rest extrapolated at B_o]"
        )
    return text
