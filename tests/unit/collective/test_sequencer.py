"""The engine's op sequencer: in order, one at a time, on the caller's thread when it waits at once.

Threads are real; every wait is on an event or a future (bounded), never a sleep.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator

import pytest

from ringseed.collective import sequencer

WAIT = 10.0  # seconds: a bound for waits that finish in microseconds when the code is right


@pytest.fixture
def seq() -> Iterator[sequencer.Sequencer]:
    s = sequencer.Sequencer(name="test-seq")
    yield s
    s.shutdown()


def recorder(log: list[tuple[str, int]], name: str) -> Callable[[], None]:
    return lambda: log.append((name, threading.get_ident()))


def blocker(started: threading.Event, release: threading.Event) -> Callable[[], None]:
    def run() -> None:
        started.set()
        assert release.wait(WAIT)

    return run


def test_an_op_nobody_waits_for_runs_on_the_background_thread(seq: sequencer.Sequencer) -> None:
    log: list[tuple[str, int]] = []
    future = seq.submit(recorder(log, "a"))
    done, _ = concurrent.futures.wait([future], timeout=WAIT)  # waits without helping
    assert done and log[0][0] == "a" and log[0][1] != threading.get_ident()


def test_an_op_queued_without_waking_runs_on_the_thread_that_helps(seq: sequencer.Sequencer) -> None:
    log: list[tuple[str, int]] = []
    future = seq.submit(recorder(log, "a"), wake=False)
    seq.help(future)
    assert future.done() and log == [("a", threading.get_ident())]


def test_run_inline_runs_here_when_idle_and_refuses_while_something_runs(seq: sequencer.Sequencer) -> None:
    log: list[tuple[str, int]] = []
    assert seq.run_inline(recorder(log, "inline"))
    assert log == [("inline", threading.get_ident())]
    started, release = threading.Event(), threading.Event()
    busy = seq.submit(blocker(started, release))
    assert started.wait(WAIT)
    assert not seq.run_inline(recorder(log, "refused"))  # would overtake a running op: not run
    assert not seq.wait_idle(0.0)
    release.set()
    assert busy.result(WAIT) is None
    assert seq.wait_idle(WAIT)
    assert [name for name, _ in log] == ["inline"]


def test_an_op_queued_without_waking_behind_a_running_one_still_runs_with_nobody_helping(
    seq: sequencer.Sequencer,
) -> None:
    """A synchronous caller that finds the sequencer busy must not be left waiting on its own op:
    whoever finishes the running op (here another caller's thread) wakes the background thread."""
    started, release = threading.Event(), threading.Event()
    log: list[tuple[str, int]] = []
    first = seq.submit(blocker(started, release), wake=False)
    other_caller = threading.Thread(target=seq.help, args=(first,))
    other_caller.start()
    assert started.wait(WAIT)
    second = seq.submit(recorder(log, "second"), wake=False)
    seq.help(second)  # returns at once: the first op is running on the other caller's thread
    assert not second.done()
    release.set()
    other_caller.join(WAIT)  # its help() returns once *its* op is done; it does not run ours
    done, _ = concurrent.futures.wait([first, second], timeout=WAIT)  # and nobody helps ours
    assert len(done) == 2
    assert log[0][0] == "second" and log[0][1] not in (threading.get_ident(), other_caller.ident)


def test_ops_run_in_submission_order_whoever_runs_them(seq: sequencer.Sequencer) -> None:
    order: list[int] = []
    started, release = threading.Event(), threading.Event()
    futures = [seq.submit(blocker(started, release))]
    assert started.wait(WAIT)
    for i in range(20):
        futures.append(seq.submit(lambda i=i: order.append(i), wake=i % 2 == 0))
    helper = threading.Thread(target=seq.help, args=(futures[-1],))
    helper.start()
    release.set()
    futures[-1].result(WAIT)  # helps too
    helper.join(WAIT)
    assert order == list(range(20))


def test_shutdown_cancels_what_has_not_started(seq: sequencer.Sequencer) -> None:
    started, release = threading.Event(), threading.Event()
    running = seq.submit(blocker(started, release))
    assert started.wait(WAIT)
    queued = seq.submit(lambda: None, wake=False)
    assert seq.shutdown() == [queued]
    assert queued.cancelled()
    release.set()
    assert running.result(WAIT) is None
    with pytest.raises(RuntimeError, match="shut down"):
        seq.submit(lambda: None)
    assert not seq.run_inline(lambda: None)
