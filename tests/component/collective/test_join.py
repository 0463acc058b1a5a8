"""A peer joining mid-training: accepted by vote, gets the shared state (hash-checked), and the
next all-reduce includes it."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from ringseed.collective import communicator, state
from tests.component.collective import coordinator_helpers as h


def _model(seed: int) -> state.SharedState:
    rng = np.random.default_rng(seed)
    return state.SharedState({"w": rng.standard_normal((8, 5)).astype(np.float32), "b": np.zeros(3, np.float64)})


def test_newcomer_is_accepted_synced_and_included() -> None:
    with h.running_coordinator(min_peers=2) as url, h.connected_peers(url, 2) as comms:
        models = [_model(0), _model(0)]
        for m in models:
            m.tensors["b"] += 1.5  # one training step, identical on both peers
        assert h.on_each(comms, lambda i, c: c.sync_shared_state(models[i])) == [1, 1]
        newcomer = h.make_peer(url, "late")
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                joining = pool.submit(newcomer.connect, timeout=30)
                accepted: list[list[str]] = []
                while not accepted or not accepted[0]:  # vote between steps until the newcomer registered
                    accepted = h.on_each(comms, lambda i, c: c.accept_new_peers())
                joining.result(30)
            assert accepted == [["late"], ["late"]]
            everyone = [*comms, newcomer]
            fresh = _model(99)  # the newcomer's own initialisation differs
            models.append(fresh)
            revisions = h.on_each(everyone, lambda i, c: c.sync_shared_state(models[i]))
            assert revisions == [2, 2, 2]
            for name in ("w", "b"):
                assert fresh.tensors[name].tobytes() == models[0].tensors[name].tobytes()
            assert fresh.hashes() == models[0].hashes()
            arrays = [np.full(10, i + 1.0, dtype=np.float32) for i in range(3)]
            h.on_each(everyone, lambda i, c: c.all_reduce(arrays[i]).wait(30))
            assert all((a == 6.0).all() for a in arrays)
            assert all(c.world_size == 3 for c in everyone)
        finally:
            newcomer.close()


def test_sync_with_mismatched_tensor_names_fails_everywhere() -> None:
    with h.running_coordinator(min_peers=2) as url, h.connected_peers(url, 2) as comms:
        models = [_model(0), state.SharedState({"other": np.zeros(2)})]

        def sync(i: int, c: communicator.Communicator) -> str:
            with pytest.raises(state.StateSyncError) as err:
                c.sync_shared_state(models[i])
            return str(err.value)

        assert all("tensors" in reason for reason in h.on_each(comms, sync))
