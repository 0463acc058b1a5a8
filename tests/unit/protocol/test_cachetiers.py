"""Tier budgets: hard limits, spill before drop, never drop what is not persisted, pins, back-pressure."""

from __future__ import annotations

from ringseed.protocol import cachetiers as tiers

M = tiers.Tier.MEMORY
S = tiers.Tier.SSD


def put(book: tiers.TierBook, key: str, size: int, *, evictable: bool = False, now: float = 0.0) -> None:
    plan = book.reserve(size, tiers=(M, S), now=now)
    assert isinstance(plan, tiers.Granted), plan
    assert book.fill(plan.ticket, key=key, size=size, evictable=evictable, now=now)


def carry_out(book: tiers.TierBook, plan: tiers.Plan) -> None:
    assert isinstance(plan, tiers.Make), plan
    for key in plan.drop:
        book.begin_move(key)
        book.dropped(key)
    for key in plan.spill:
        book.begin_move(key)
        book.spilled(key)


def test_grants_within_budget_and_counts_reservations() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=0)
    first = book.reserve(60, now=0)
    assert isinstance(first, tiers.Granted) and book.used(M) == 60
    assert isinstance(book.reserve(60, now=0), tiers.Blocked)
    book.release(first.ticket)
    assert book.used(M) == 0


def test_unpersisted_chunks_spill_to_ssd_oldest_first_and_are_never_dropped() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=100)
    put(book, "a", 50, now=1)
    put(book, "b", 50, now=2)
    plan = book.reserve(50, now=0)
    assert plan == tiers.Make(spill=("a",), drop=())
    carry_out(book, plan)
    assert book.get("a").tier is S and book.used(M) == 50 and book.used(S) == 50
    assert isinstance(book.reserve(50, now=0), tiers.Granted)
    put(book, "c", 50)  # lands in SSD (memory full of b + the reservation)
    blocked = book.reserve(50, now=0)
    assert isinstance(blocked, tiers.Blocked) and "not yet persisted" in blocked.reason
    assert book.used(M) <= 100 and book.used(S) <= 100


def test_persisted_chunks_are_dropped_when_the_ssd_has_no_room() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=0)
    put(book, "a", 60, evictable=True)
    plan = book.reserve(60, now=0)
    assert plan == tiers.Make(spill=(), drop=("a",))
    carry_out(book, plan)
    assert book.get("a") is None and isinstance(book.reserve(60, now=0), tiers.Granted)


def test_a_non_evictable_spill_drops_evictable_ssd_chunks_first() -> None:
    book = tiers.TierBook(memory_bytes=50, ssd_bytes=50)
    put(book, "old", 50, evictable=True)  # memory
    carry_out(book, book.reserve(50, now=0))  # spilled "old" to SSD
    put(book, "new", 50)  # memory, not persisted
    plan = book.reserve(50, now=0)
    assert plan == tiers.Make(spill=("new",), drop=("old",))


def test_touched_chunks_are_kept_longer_and_pinned_ones_are_never_moved() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=100)
    put(book, "a", 50, now=1)
    put(book, "b", 50, now=2)
    book.touch("a", now=3)
    assert book.reserve(50, now=0) == tiers.Make(spill=("b",), drop=())
    book.pin("b")
    assert book.reserve(50, now=0) == tiers.Make(spill=("a",), drop=())
    book.pin("a")
    assert isinstance(book.reserve(50, now=0), tiers.Blocked)
    book.unpin("a")
    assert book.reserve(50, now=0) == tiers.Make(spill=("a",), drop=())


def test_a_read_lease_keeps_a_chunk_until_it_ends() -> None:
    book = tiers.TierBook(memory_bytes=50, ssd_bytes=0)
    put(book, "a", 50, evictable=True)
    book.lease("a", until=10.0)
    assert isinstance(book.reserve(50, now=9.0), tiers.Blocked)
    assert book.reserve(50, now=10.0) == tiers.Make(spill=(), drop=("a",))


def test_a_chunk_larger_than_the_budget_says_so() -> None:
    book = tiers.TierBook(memory_bytes=10, ssd_bytes=0)
    plan = book.reserve(11, now=0)
    assert isinstance(plan, tiers.Blocked) and "smaller than 11" in plan.reason


def test_duplicate_fill_releases_the_reservation() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=0)
    put(book, "a", 40)
    plan = book.reserve(40, now=0)
    assert isinstance(plan, tiers.Granted)
    assert not book.fill(plan.ticket, key="a", size=40, evictable=False, now=0)
    assert book.used(M) == 40


def test_free_bytes_counts_free_and_evictable() -> None:
    book = tiers.TierBook(memory_bytes=100, ssd_bytes=100)
    put(book, "a", 30, evictable=True)
    put(book, "b", 30)
    assert book.free_bytes(now=0) == 100 + 100 - 60 + 30


def epochs_hit_ratio(*, cold: bool, cache_chunks: int, dataset_chunks: int, epochs: int) -> float:
    """Sequential epochs over a dataset through a cache: chunks found in the cache / chunks read."""
    book = tiers.TierBook(memory_bytes=cache_chunks, ssd_bytes=0)
    hits = reads = 0
    now = 0.0
    for _ in range(epochs):
        for chunk in range(dataset_chunks):
            now += 1
            reads += 1
            key = f"c{chunk}"
            if book.get(key) is not None:
                hits += 1
                book.touch(key, now=now)
                continue
            plan = book.reserve(1, now=now)
            if isinstance(plan, tiers.Make):
                carry_out(book, plan)
                plan = book.reserve(1, now=now)
            assert isinstance(plan, tiers.Granted)
            book.fill(plan.ticket, key=key, size=1, evictable=True, now=now, cold=cold)
    return hits / reads


def test_dataset_epochs_larger_than_the_cache_keep_hitting_with_bimodal_insertion() -> None:
    lru = epochs_hit_ratio(cold=False, cache_chunks=50, dataset_chunks=100, epochs=6)
    bip = epochs_hit_ratio(cold=True, cache_chunks=50, dataset_chunks=100, epochs=6)
    assert lru == 0.0  # LRU evicts every chunk before its next epoch
    assert bip > 0.35  # about cache / dataset (0.5) after the first epoch
    fits_lru = epochs_hit_ratio(cold=False, cache_chunks=100, dataset_chunks=100, epochs=3)
    fits_bip = epochs_hit_ratio(cold=True, cache_chunks=100, dataset_chunks=100, epochs=3)
    assert fits_lru == fits_bip == 2 / 3  # everything cached after epoch 1 either way
