"""The simulated swarm: everyone ends with the whole model, never faster than the bound, failures survived."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ringseed.sim import scenario, swarm

MB = 10**6


def small(**overrides: object) -> scenario.Scenario:
    values: dict[str, object] = {
        "model_bytes": 64 * MB,
        "chunk_bytes": 4 * MB,
        "nodes": 12,
        "origin_rate": 10 * MB,
        "node_up": 100 * MB,
        "node_down": 100 * MB,
    }
    values.update(overrides)
    return scenario.Scenario(**values)  # type: ignore[arg-type]


def test_bound_matches_the_classic_estimate() -> None:
    bound = scenario.t_star(
        model_bytes=500 * 10**9, chunk_bytes=10**9, nodes=1000, origin_rate=1.25e9, node_rate=1.25e9
    )
    assert bound == pytest.approx(408.0)


def test_every_node_gets_every_chunk_and_the_origin_sends_the_model_once() -> None:
    sw = swarm.Swarm(small())
    result = sw.run()
    assert result.completed == 12
    assert all(not core.missing for core in sw.cores)
    assert result.origin_bytes == 64 * MB
    assert result.seconds >= 64 * MB / (10 * MB) * (1 - 1e-9)  # never faster than the origin pipe


def test_cut_through_beats_store_and_forward_which_never_beats_its_bound() -> None:
    config = small(nodes=16)
    stored = swarm.Swarm(dataclasses.replace(config, agents=scenario.Agents(stream_slots=0)))
    plain = stored.run()
    assert stored.streamed == 0
    assert plain.seconds >= plain.bound * (1 - 1e-9)  # the hop term holds without cut-through
    streaming = swarm.Swarm(config)
    fast = streaming.run()
    assert streaming.streamed > 0
    assert fast.seconds < plain.seconds
    assert fast.origin_bytes == plain.origin_bytes == 64 * MB


def test_with_node_links_ten_times_the_origin_it_stays_near_the_bound() -> None:
    result = swarm.simulate(small(nodes=16))
    assert result.ratio < 1.3


def test_same_seed_same_run() -> None:
    first = swarm.simulate(small(seed=7))
    second = swarm.simulate(small(seed=7))
    assert (first.seconds, first.transfers) == (second.seconds, second.transfers)


def test_failed_nodes_are_left_out_and_survivors_finish() -> None:
    result = swarm.simulate(small(nodes=40, fail_fraction=0.1))
    assert result.failed == 4
    assert result.completed == 36
    assert math.isfinite(result.seconds)


def test_origin_duty_moves_when_the_seeder_dies() -> None:
    sw = swarm.Swarm(small(agents=scenario.Agents(offline_after=0.5, heartbeat_interval=0.25)))
    sw.fail_at(node=0, when=2.0)  # node 0 is the first registered: it holds origin duty
    result = sw.run()
    assert result.failed == 1
    assert result.completed == 11
    assert sw.tracker.duty and sw.tracker.duty != ["0"]  # the real tracker handed the duty on
    assert result.origin_bytes >= 64 * MB


def test_prefix_approximation_is_stated_and_close_to_the_full_run() -> None:
    full = swarm.simulate(small(model_bytes=160 * MB))
    approx_config = small(model_bytes=160 * MB, prefix_chunks=16)
    approx = swarm.simulate(approx_config)
    assert "approx" in scenario.describe(approx_config)
    assert approx.seconds == pytest.approx(full.seconds, rel=0.1)


def test_failures_happen_inside_a_prefix_run() -> None:
    result = swarm.simulate(small(nodes=40, fail_fraction=0.1, model_bytes=400 * MB, prefix_chunks=8))
    assert result.failed == 4
    assert result.completed == 36


def test_liars_are_reported_and_penalised_and_nobody_holds_a_bad_chunk() -> None:
    sw = swarm.Swarm(small(nodes=16, liars=2, bad_ram=1, node_up=20 * MB, node_down=20 * MB))
    result = sw.run()
    assert result.completed == 15  # the bad-RAM node never verifies a chunk (it is not waited for)
    assert result.reports > 0
    assert result.penalised_liars == 2  # the real tracker's trust rules, fed by the real core's reports
    assert result.penalised_honest == 0  # the bad-RAM node's reports of honest holders count for nothing
    assert all(set(core.held.values()) <= {swarm.TRUE_HASH.format(i) for i in core.held} for core in sw.cores)


def test_a_paced_swarm_announces_at_the_pace_and_completes_later() -> None:
    """With a small heartbeat budget a node announces verified chunks no sooner than its gap after
    its last announcement (12 nodes at 3 per second: 4 s; the origin-duty node keeps 0.05 s, no
    front seats: in 12 nodes every copy is at the front), so holders become known later (store
    and forward: every copy but the first is from a holder)."""
    fast = swarm.simulate(small(agents=scenario.Agents(stream_slots=0)))
    paced_agents = scenario.Agents(stream_slots=0, heartbeat_rate=3.0, offline_after=30.0, front_seats=0)
    sw = swarm.Swarm(small(agents=paced_agents))
    times: dict[int, list[float]] = {}
    announce = sw._announce

    def recorded(node: int) -> None:
        times.setdefault(node, []).append(sw.net.now)
        announce(node)

    sw._announce = recorded  # type: ignore[method-assign]
    paced = sw.run()
    assert paced.completed == fast.completed == 12
    assert paced.origin_bytes == fast.origin_bytes == 64 * MB  # the origin still sends the model once
    assert paced.simulated_seconds > fast.simulated_seconds
    followers = [n for n in times if n not in sw.duty]
    assert len(followers) == 11
    for node in followers:
        gaps = [b - a for a, b in zip(times[node], times[node][1:], strict=False)]
        assert gaps and min(gaps) >= 4.0 - 1e-9
