"""The fluid link model: shares, completions, cancellation (exact arithmetic on small cases)."""

from __future__ import annotations

import pytest

from ringseed.sim import flow


def test_one_transfer_runs_at_the_slower_end() -> None:
    net = flow.Network(up=[100.0, 0.0], down=[0.0, 50.0])
    net.start(sender=0, receiver=1, chunk=0, size=100)
    done = net.pop()
    assert done.chunk == 0
    assert net.now == pytest.approx(2.0)


def test_two_uploads_share_the_sender_and_the_survivor_speeds_up() -> None:
    net = flow.Network(up=[100.0, 0.0, 0.0], down=[0.0, 1000.0, 1000.0])
    net.start(sender=0, receiver=1, chunk=0, size=50)
    net.start(sender=0, receiver=2, chunk=1, size=100)
    first = net.pop()
    assert (first.chunk, net.now) == (0, pytest.approx(1.0))  # 50 bytes at 50 B/s
    second = net.pop()
    assert (second.chunk, net.now) == (1, pytest.approx(1.5))  # 50 left at the full 100 B/s


def test_full_duplex_upload_and_download_do_not_share() -> None:
    net = flow.Network(up=[100.0, 100.0], down=[100.0, 100.0])
    net.start(sender=0, receiver=1, chunk=0, size=100)
    net.start(sender=1, receiver=0, chunk=1, size=100)
    net.pop()
    net.pop()
    assert net.now == pytest.approx(1.0)


def test_cancelled_transfer_never_completes_and_frees_its_share() -> None:
    net = flow.Network(up=[100.0, 0.0, 0.0], down=[0.0, 1000.0, 1000.0])
    gone = net.start(sender=0, receiver=1, chunk=0, size=100)
    net.start(sender=0, receiver=2, chunk=1, size=100)
    net.advance(0.5)
    net.cancel(gone)
    done = net.pop()
    assert done.chunk == 1
    assert net.now == pytest.approx(1.25)  # 25 bytes by t=0.5, then 75 at 100 B/s
    assert net.next_time() == float("inf")
