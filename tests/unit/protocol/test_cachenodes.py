"""Cache master soft state: placement away from the writer, holders, persist duty, evictable and orphan chunks."""

from __future__ import annotations

import pytest

from ringseed.protocol import cachelog, cachenodes

A = "aa" * 32
B = "bb" * 32
C = "cc" * 32


def nodes(count: int = 4, *, group: str = "g", free: int = 1 << 30) -> cachenodes.Nodes:
    state = cachenodes.Nodes(offline_after=10.0, orphan_grace=60.0)
    for i in range(count):
        state.register(name=f"n{i}", url=f"http://n{i}", session="s", group=group, chunks=[], free_bytes=free, now=0.0)
    return state


def committed(*files: tuple[str, list[str]], writer: str = "n0") -> cachelog.Metadata:
    meta = cachelog.Metadata()
    for i, (path, shas) in enumerate(files):
        entry = meta.prepare_commit(
            write_id=f"w{i}",
            writer=writer,
            time=0.0,
            files=[{"path": path, "size": len(shas), "chunks": [[s, 1] for s in shas]}],
        )
        meta.apply(meta.seq + 1, entry)
    return meta


def test_replicas_go_to_the_next_nodes_in_ring_order_never_the_writer() -> None:
    state = nodes(4)
    assert cachenodes.names(state.place(writer="n1", count=1)) == ["n2"]
    assert cachenodes.names(state.place(writer="n3", count=2)) == ["n0", "n1"]
    targets = [state.place(writer=f"n{i}", count=1)[0].name for i in range(4)]
    assert sorted(targets) == ["n0", "n1", "n2", "n3"]  # every node receives exactly one stream


def test_placement_prefers_the_writers_group_and_skips_full_nodes() -> None:
    state = nodes(3)
    state.register(name="m0", url="http://m0", session="s", group="other", chunks=[], free_bytes=1, now=0.0)
    state.register(name="n9", url="http://n9", session="s", group="g", chunks=[], free_bytes=0, now=0.0)
    chosen = cachenodes.names(state.place(writer="n2", count=3))
    assert chosen == ["n0", "n1", "m0"]


def test_not_enough_nodes_is_a_clear_error() -> None:
    state = nodes(1)
    with pytest.raises(cachenodes.NotEnoughNodes, match="2 copies asked"):
        state.place(writer="n0", count=1)


def test_silent_nodes_are_purged_and_stop_counting_as_holders() -> None:
    state = nodes(2)
    state.register(name="n1", url="http://n1", session="s", group="g", chunks=[A], free_bytes=1, now=0.0)
    meta = committed(("ck/m", [A]))
    assert state.copies(meta.get("ck/m")) == 1
    state.heartbeat(name="n0", now=9.0, added=[A], dropped=[], free_bytes=1, meta=meta, sink=False)
    assert state.copies(meta.get("ck/m")) == 2
    assert state.purge(now=15.0) == ["n1"]
    assert cachenodes.names(state.holders_of(A)) == ["n0"]
    with pytest.raises(cachenodes.UnknownNode):
        state.heartbeat(name="n1", now=15.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=False)


def test_persist_duty_goes_to_the_writer_and_moves_when_it_dies() -> None:
    state = nodes(3)
    meta = committed(("ck/m", [A, B]), writer="n1")
    for name in ("n1", "n2"):
        state.heartbeat(name=name, now=1.0, added=[A, B], dropped=[], free_bytes=1, meta=meta, sink=True)
    duties = state.heartbeat(name="n1", now=2.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert duties.persist == [("ck/m", 1)]
    assert state.heartbeat(name="n2", now=2.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True).persist == []
    state.nodes["n0"].last_seen = state.nodes["n2"].last_seen = 20.0
    state.purge(now=20.0)  # n1 silent since 2.0
    duties = state.heartbeat(name="n2", now=20.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert duties.persist == [("ck/m", 1)]  # the remaining replica holder
    assert state.heartbeat(name="n2", now=21.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=False).persist == []


def test_a_chunk_becomes_evictable_only_when_every_object_using_it_is_persisted() -> None:
    state = nodes(1)
    meta = committed(("a/m", [A, B]), ("b/m", [B, C]))
    first = state.heartbeat(name="n0", now=1.0, added=[A, B, C], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert first.evictable_add == []
    entry = meta.prepare_persisted(path="a/m", version=meta.get("a/m").version)
    assert entry is not None
    meta.apply(meta.seq + 1, entry)
    second = state.heartbeat(name="n0", now=2.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert second.evictable_add == [A]  # B is still used by the unpersisted b/m
    entry = meta.prepare_commit(
        write_id="w9", writer="n0", time=0, files=[{"path": "c/m", "size": 1, "chunks": [[A, 1]]}]
    )
    meta.apply(meta.seq + 1, entry)
    third = state.heartbeat(name="n0", now=3.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert third.evictable_remove == [A]  # a new unpersisted object shares A


def test_unreferenced_chunks_are_dropped_after_the_grace() -> None:
    state = nodes(1)
    meta = committed(("a/m", [A]))
    assert state.heartbeat(name="n0", now=0.0, added=[A, B], dropped=[], free_bytes=1, meta=meta, sink=False).drop == []
    assert state.heartbeat(name="n0", now=59.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=False).drop == []
    assert state.heartbeat(name="n0", now=61.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=False).drop == [B]


def test_a_checkpoint_that_lost_a_holder_gets_a_new_one_until_it_is_persisted() -> None:
    state = nodes(4)
    state.register(name="m0", url="http://m0", session="s", group="other", chunks=[], free_bytes=1, now=0.0)
    meta = committed(("ck/m", [A, B]), writer="n1")
    for name in ("n1", "n2"):
        state.heartbeat(name=name, now=1.0, added=[A, B], dropped=[], free_bytes=1, meta=meta, sink=True)
    beat = {"dropped": [], "free_bytes": 1, "meta": meta, "sink": True, "replicas": 2}
    assert all(state.heartbeat(name=n, now=2.0, added=[], **beat).copy == [] for n in state.nodes)  # 2 copies
    for name in ("n0", "n2", "n3", "m0"):
        state.nodes[name].last_seen = 20.0
    assert state.purge(now=20.0) == ["n1"]  # the writer's node is lost: one copy left, on n2
    assert state.heartbeat(name="m0", now=20.0, added=[], **beat).copy == []  # the writer's group first
    assert state.heartbeat(name="n2", now=20.0, added=[], **beat).copy == []  # it holds a copy already
    version = meta.get("ck/m").version
    assert state.heartbeat(name="n0", now=20.0, added=[], **beat).copy == []  # one new holder is enough
    assert state.heartbeat(name="n3", now=20.0, added=[], **beat).copy == [("ck/m", version)]  # the ring after n1
    assert state.heartbeat(name="n3", now=21.0, added=[A], **beat).copy == [("ck/m", version)]  # sticky while it pulls
    assert state.heartbeat(name="n0", now=21.0, added=[], **beat).copy == []
    assert state.heartbeat(name="n3", now=22.0, added=[B], **beat).copy == []  # a complete copy again
    assert state.assign_copies(meta, replicas=2) == {}
    # the new holder is lost too: another node takes the duty; every chunk needs an online holder
    state.nodes["n0"].last_seen = state.nodes["n2"].last_seen = state.nodes["m0"].last_seen = 40.0
    assert state.purge(now=40.0) == ["n3"]
    assert state.heartbeat(name="n0", now=40.0, added=[], **beat).copy == [("ck/m", version)]
    state.heartbeat(name="n2", now=41.0, added=[], dropped=[B], free_bytes=1, meta=meta, sink=True)
    assert state.assign_copies(meta, replicas=2) == {}  # B has no online holder left: nothing to copy from
    state.heartbeat(name="n2", now=42.0, added=[B], dropped=[], free_bytes=1, meta=meta, sink=True)
    assert state.heartbeat(name="n0", now=42.0, added=[], **beat).copy == [("ck/m", version)]
    # without replicas (a new leader still learning holders) a heartbeat gives no copy duty
    assert state.heartbeat(name="n0", now=43.0, added=[], dropped=[], free_bytes=1, meta=meta, sink=True).copy == []
    entry = meta.prepare_persisted(path="ck/m", version=version)
    assert entry is not None
    meta.apply(meta.seq + 1, entry)
    assert state.assign_copies(meta, replicas=2) == {}  # persisted: the sink holds it
