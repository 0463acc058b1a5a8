"""Two tracker replicas: SIGKILL the leader mid-distribution, the follower takes over, every node completes."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringseed.local import swarm
from tests.component.distribution.conftest import MiB, assert_copies, make_model, odd_sizes, source_manifest

RATE = 12 * MiB  # the 48 MiB model takes about 4 s to leave the origin


def ready(url: str) -> dict[str, Any] | None:
    """A replica's ``/readyz`` (200 leading, 503 following); None while it does not answer."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
        return body
    except OSError:
        return None


def test_the_follower_takes_over_within_a_heartbeat_timeout_and_nothing_verified_is_fetched_again(
    tmp_path: Path, swarm_factory: Callable[..., swarm.LocalSwarm]
) -> None:
    root = make_model(tmp_path / "model", odd_sizes(48))
    expected = source_manifest(root, chunk_size=MiB)
    total = expected.layout.total_size
    local = swarm_factory(source=root.as_uri(), nodes=4, chunk_size=MiB, origin_rate_limit=RATE, masters=2)
    local.start()
    status = local.wait_for(
        lambda s: (
            min((int(n["chunks"]) for n in s["nodes"].values()), default=0) >= expected.layout.chunk_count // 4
            and len(s["nodes"]) == 4
        ),
        timeout=120,
        what="every node at 25%",
    )
    states = {url: ready(url) for url in local.master_urls}
    leaders = [url for url, body in states.items() if body is not None and body["leading"]]
    assert len(leaders) == 1, states
    leader = leaders[0]
    follower = next(url for url in local.master_urls if url != leader)
    follower_state = states[follower]
    assert follower_state is not None and follower_state["leader_url"] == leader  # it follows, and knows whom
    held_before = {name: int(entry["chunks"]) for name, entry in status["nodes"].items()}

    local.kill(local.master_name(local.master_urls.index(leader)))
    killed = time.monotonic()
    while (body := ready(follower)) is None or not body["leading"]:
        assert time.monotonic() - killed < local.offline_after, f"no takeover within {local.offline_after} s"
        time.sleep(0.05)
    took = time.monotonic() - killed
    assert took <= local.offline_after, took

    status = local.wait_for(local.all_verified, timeout=120, what="all verified after the failover")
    assert local.master_url == follower and status["manifest_digest"] == expected.digest
    assert_copies(local, expected)
    for name, entry in status["nodes"].items():
        # each agent counts what it fetched over its life (peers and origin): the model once, not
        # the chunks it held before the failover a second time (a cut stream may add a chunk)
        assert entry["bytes_fetched"] <= total + MiB, (name, entry["bytes_fetched"], held_before[name])
    assert status["bytes_from_origin"] <= 1.1 * total
