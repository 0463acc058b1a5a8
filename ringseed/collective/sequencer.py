"""Runs an engine's operations one at a time, in submission order, on whichever thread gets there first.

What this module owns
- :class:`Sequencer`: a queue of operations and one background thread (started with it, never
  per operation) that runs them in order. A thread that waits for an operation nobody has
  started yet runs the queue up to it itself (it "helps"), so a synchronous caller's operation
  runs on the caller's own thread with no hand-off to another thread and back: that is most of
  a small message's latency in Python. Asynchronous callers are served by the background thread,
  so an operation never waits for its caller to come back (no deadlock with work the caller
  does in between, such as point-to-point sends the peers wait for).
- :meth:`Sequencer.run_inline`: a synchronous caller's operation runs at once on its thread
  when nothing is queued or running, with no future at all (small messages).
- ``submit(fn, wake=False)``: for a caller that waits at once (a synchronous collective): the
  operation is queued *without waking* the background thread, and the caller runs it. Waking
  that thread for an operation it will not run costs a thread switch and a fight for the GIL
  per operation, which on a busy machine was most of a small message's latency.
- :class:`OpFuture`: a ``concurrent.futures.Future`` whose ``result`` and ``exception`` help.

Rules
- At most one operation runs at any time, and in submission order, whoever runs it.
- Every queued operation makes progress without its caller: whoever finishes an operation
  wakes the background thread when the queue is not empty (so an operation queued by
  ``wake=False`` behind a running one is taken up when that one ends).
- :meth:`Sequencer.shutdown` cancels what has not started and lets the thread end; it never waits.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


class OpFuture(concurrent.futures.Future[None]):
    """The future of one operation; waiting on it runs the queue up to it if nobody is running it."""

    def __init__(self, sequencer: Sequencer, fn: Callable[[], None]) -> None:
        super().__init__()
        self._sequencer, self.fn = sequencer, fn

    def result(self, timeout: float | None = None) -> None:
        self._sequencer.help(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._sequencer.help(self)
        return super().exception(timeout)


class Sequencer:
    """One-at-a-time, in-order execution with a background thread and helping waiters."""

    def __init__(self, *, name: str) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[OpFuture] = collections.deque()
        self._running = False
        self._closed = False
        self._idle_waiters = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None], *, wake: bool = True) -> OpFuture:
        """Queue ``fn``; the background thread runs it unless a waiter gets there first.

        ``wake=False`` is for a caller that helps at once (:meth:`help`, or waits on the
        future): the background thread is not woken for it, so it runs on the caller's thread
        if nothing is running; if something is, whoever finishes that takes it up, in order."""
        future = OpFuture(self, fn)
        with self._cond:
            if self._closed:
                raise RuntimeError("the sequencer is shut down")
            self._queue.append(future)
            if wake:
                self._cond.notify()
        return future

    def run_inline(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on this thread now if nothing is queued or running (no future, no queue):
        the cheapest path for a synchronous caller. False, without running it, otherwise."""
        with self._cond:
            if self._running or self._queue or self._closed:
                return False
            self._running = True
        try:
            fn()
        finally:
            self._release()
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing runs (a closing owner waits for the operation it aborted to unwind)."""
        with self._cond:
            self._idle_waiters += 1
            try:
                return self._cond.wait_for(lambda: not self._running, timeout)
            finally:
                self._idle_waiters -= 1

    def help(self, target: concurrent.futures.Future[Any]) -> None:
        """Run queued operations on this thread until ``target`` is done or someone else is running."""
        while not target.done():
            future = self._claim(block=False)
            if future is None:
                return
            self._run(future)

    def idle(self) -> bool:
        """Nothing queued or running (a caller may then run an operation inline, in order)."""
        with self._cond:
            return not self._running and not self._queue

    def shutdown(self) -> list[OpFuture]:
        """Refuse new work, cancel what has not started (returned), and let the thread end."""
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for future in dropped:
            future.cancel()
        return dropped

    def _claim(self, *, block: bool) -> OpFuture | None:
        with self._cond:
            while True:
                if self._queue and not self._running:
                    self._running = True
                    return self._queue.popleft()
                if not block or (self._closed and not self._queue):
                    return None
                self._cond.wait()

    def _run(self, future: OpFuture) -> None:
        try:
            if future.set_running_or_notify_cancel():
                try:
                    future.fn()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(None)
        finally:
            self._release()

    def _release(self) -> None:
        with self._cond:
            self._running = False
            if self._idle_waiters:
                self._cond.notify_all()
            elif self._queue:  # then only the background thread waits on the condition
                self._cond.notify()

    def _serve(self) -> None:
        while (future := self._claim(block=True)) is not None:
            self._run(future)
