"""The simulated swarm: ringseed's own agent core and tracker, on simulated links and time.

Owns the simulated world around the real decision code: each node is a
:class:`ringseed.protocol.agentcore.AgentCore` (chunk and holder choice, retries, avoid lists,
streams, end game, origin duty, reports), the master is a :class:`ringseed.protocol.tracker.Tracker`
(holdings, hashes, peers offered least loaded first, origin assignments, purge and duty
hand-over, trust); this module only carries out their actions on :mod:`ringseed.sim.flow`'s
links and feeds the results back, as the aiohttp agent and master do with sockets. Rules:

- Time: one heap of timers plus the network's completions; every event is handled at its time,
  then every node it touched is ticked (``AgentCore.tick``) and its next wakeup
  (``AgentCore.next_wakeup``) is scheduled, so a node retries as the agent does (busy holders:
  about ``retry_after`` later), except a node that tried everything it could fetch and found
  every holder busy: it waits for a freed slot or a new copy instead (``Swarm._park``;
  optimistic, see there).
- The tracker's answers are immediate (no request latency); announcements go to the tracker as
  soon as a chunk is held (the agent's early heartbeat), or, with ``Agents.heartbeat_rate``,
  no sooner than the gap the tracker's pace names after the node's last one
  (:mod:`ringseed.protocol.pacing`), and every live node heartbeats each
  ``heartbeat_interval`` with its load, followed by the tracker's periodic pass (``purge``:
  silent nodes dropped, duty handed on, trust judged). Nodes read availability and the chunks
  being pulled from the tracker's live view (the long-poll of issue 11 part 3 brings news
  without polling); a copy that appears makes the chunk ready at once for the nodes backing off
  on it, and a new hash or copy wakes the nodes that had nothing to do.
- Transfers: a :class:`~ringseed.protocol.agentsteps.Fetch` from a live holder with a free upload
  slot (``upload_slots``) starts a transfer; a full holder answers 429, a dead one is
  unreachable. A stream from the puller is admitted while the pull's streams keep up with the
  origin on the puller's uplink (``node_up // origin_rate - 1``, at most ``stream_slots``); its
  bytes arrive with the pull's last byte (not modelled: its share of the puller's uplink). A
  stored chunk is held ``process_delay`` after its last byte (hashing, storing; the download
  slot stays taken). Origin duty takes the source ``start_delay`` after it is gained.
- Faults: a failed node stops at once (its transfers are cut: receivers see a broken body);
  the tracker notices after ``offline_after``. A *liar* serves bytes that fail verification; a
  *bad-RAM* node receives every chunk corrupted (and so reports honest holders): what the
  tracker's trust rules make of their reports is the real tracker's.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ringseed.protocol import agentcore, agentsteps, manifest, pacing, tracker
from ringseed.sim import flow, scenario

TRUE_HASH = "{:064x}"  # chunk i's (a valid SHA-256 spelling; the tracker checks)
BAD_HASH = "b" * 64


@dataclass(eq=False)
class _Flight:
    """A job's transfer in progress (or a stream waiting on a pull)."""

    node: int
    job: int
    index: int
    sender: int
    transfer: flow.Transfer | None = None
    stream_of: flow.Transfer | None = None


class Swarm:
    """One run of a :class:`ringseed.sim.scenario.Scenario`."""

    def __init__(self, config: scenario.Scenario) -> None:
        self.config = config
        self.agents = config.agents
        self.rng = random.Random(config.seed)
        count = config.simulated_chunks
        total = config.chunk_bytes * count
        if config.prefix_chunks is None or config.prefix_chunks >= config.chunks:
            total = config.model_bytes
        self.layout = manifest.Layout.build([("model", total, 0o644)], chunk_size=config.chunk_bytes)
        self.sizes = [self.layout.chunk_length(i) for i in range(self.layout.chunk_count)]
        self.nodes = config.nodes
        self.names = [str(n) for n in range(config.nodes)]
        self.origin = config.nodes  # the external source is endpoint N
        up = [config.node_up] * config.nodes + [config.origin_rate]
        down = [config.node_down] * config.nodes + [0.0]
        self.net = flow.Network(up=up, down=down)
        rate = self.agents.heartbeat_rate
        budget = (
            pacing.Budget(
                interval=self.agents.heartbeat_interval,
                gap=self.agents.early_gap,
                rate=rate,
                front_seats=self.agents.front_seats,
            )
            if rate is not None
            else None
        )
        self.tracker = tracker.Tracker(epoch="sim", offline_after=self.agents.offline_after, now=0.0, budget=budget)
        self.announced_at = [-float("inf")] * config.nodes  # each node's last announcement (paced)
        self.announcing: set[int] = set()  # nodes with an announcement timer set
        settings = agentcore.Settings(
            download_slots=self.agents.download_slots,
            origin_depth=self.agents.origin_slots,
            retry_after=self.agents.retry_after,
        )
        self.cores = [agentcore.AgentCore(settings=settings, rng=random.Random(self.rng.random())) for _ in self.names]
        self.alive = [True] * config.nodes
        self.done_at: list[float | None] = [None] * config.nodes
        self.pending = config.nodes
        self.liars = set(self.rng.sample(range(1, config.nodes), min(config.liars, max(0, config.nodes - 1))))
        rest = [n for n in range(1, config.nodes) if n not in self.liars]
        self.bad_ram = set(self.rng.sample(rest, min(config.bad_ram, len(rest))))
        self.pending -= len(self.bad_ram)  # they never verify a chunk: not waited for
        self.flights: dict[tuple[int, int], _Flight] = {}  # (node, job) -> its transfer
        self.by_transfer: dict[flow.Transfer, _Flight] = {}
        self.streams: dict[flow.Transfer, list[_Flight]] = {}  # a pull -> streams riding on it
        self.pulls: dict[int, flow.Transfer] = {}  # chunk -> its pull's transfer
        self.pulling: set[int] = set()  # chunks assigned for a pull (the tracker's, as a live set)
        self.hash_waits: dict[int, list[tuple[int, int]]] = {}  # chunk -> (node, job) awaiting its hash
        self.backing_off: dict[int, set[int]] = {}  # chunk -> nodes whose last try of it found nobody
        self.idle: set[int] = set()  # nodes with free slots and nothing they could start
        self.parked: dict[int, set[int]] = {}  # chunk -> nodes waiting for a holder's free slot
        self.parked_on: dict[int, tuple[float, list[int]]] = {}  # node -> (its wakeup, chunks)
        self.duty: set[int] = set()
        self._timers: list[tuple[float, int, str, int, int]] = []
        self._seq = itertools.count()
        self._wake_at = [float("inf")] * config.nodes
        self._dirty: set[int] = set()
        self._stores: dict[tuple[int, int], agentsteps.Store] = {}  # (node, job) -> landing after process_delay
        self.origin_bytes = 0
        self.streamed = 0
        self.reports = 0
        self.ticks = 0

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> scenario.Result:
        started = time.perf_counter()
        self._start()
        for _ in self._events():
            self._settle()
            if self.pending == 0:
                break
        return self._result(time.perf_counter() - started)

    def _start(self) -> None:
        t = self.tracker
        t.register(node=self.names[0], url="", session="s", now=0.0)
        t.publish(node=self.names[0], layout=self.layout, hashes=None, now=0.0)
        for name in self.names[1:]:
            t.register(node=name, url="", session="s", now=0.0)
        revision = t.revision
        assert revision is not None
        for _node, core in enumerate(self.cores):
            core.adopt(layout=self.layout, revision=revision, held={}, hashes={})
            core.share_view(availability=t.availability(), pulling=self.pulling)
            core.tracker_state(revision=revision, confirmed=t.confirmed, duty=False)
        self._duty_changed()
        self._schedule_failures()
        self._at(self.agents.heartbeat_interval, "pass", -1)
        self._dirty.update(range(self.nodes))
        self._settle()

    def _events(self) -> Iterator[None]:
        net, timers = self.net, self._timers
        while True:
            next_transfer = net.next_time()
            next_timer = timers[0][0] if timers else float("inf")
            if next_transfer == next_timer == float("inf"):
                return
            if next_timer <= next_transfer:
                when, _, kind, node, arg = heapq.heappop(timers)
                net.advance(when)
                self._timer(kind, node, arg)
            else:
                self._completed(net.pop())
            yield None

    def _at(self, when: float, kind: str, node: int, arg: int = -1) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), kind, node, arg))

    def _timer(self, kind: str, node: int, arg: int) -> None:
        if kind == "tick":
            if self._wake_at[node] <= self.net.now:
                self._wake_at[node] = float("inf")
                self._dirty.add(node)
        elif kind == "landed":
            self._landed(node, arg)
        elif kind == "hash_timeout":
            self._hash_timeout(node, arg)
        elif kind == "taken":
            if self.alive[node] and node in self.duty:
                revision = self.tracker.revision
                assert revision is not None
                self.cores[node].source_taken(revision=revision)
                self._dirty.add(node)
        elif kind == "pass":
            self._pass()
        elif kind == "announce":
            self.announcing.discard(node)
            if self.alive[node]:
                self._announce(node)
        elif kind == "fail":
            self._fail(node)

    def _settle(self) -> None:
        """Tick every node an event touched; schedule each one's next wakeup."""
        now = self.net.now
        while self._dirty:
            node = self._dirty.pop()
            if not self.alive[node]:
                continue
            core = self.cores[node]
            if node in self.parked_on:
                self._unpark(node, schedule=False)
            self.ticks += 1
            self._perform(node, core.tick(now=now))
            if node in self._dirty:
                continue
            if core.downloading < self.agents.download_slots and core.missing:
                self.idle.add(node)
            else:
                self.idle.discard(node)
            wake = core.next_wakeup(now=now)
            if wake < float("inf") and self._park(node, wake):
                continue
            self._schedule(node, wake)

    def _schedule(self, node: int, wake: float) -> None:
        if wake < self._wake_at[node]:
            self._wake_at[node] = wake
            self._at(wake, "tick", node)

    def _park(self, node: int, wake: float) -> bool:
        """Instead of polling, wait for a holder of what it wants to free a slot (or a new copy).

        Only when every chunk the node could fetch was just tried and found no free holder: its
        polls would fail until a holder frees a slot, so it ticks then (at its back-off's end, or
        later), with far fewer events. Not outcome-neutral: the agent's polls on its 0.1 s grid
        lose more time than this (BENCHMARKS section 3: lag 39.6 s against 25.1 s at N = 100,
        K = 32), so parked runs are optimistic.
        """
        core = self.cores[node]
        waiting = [i for i in core.wanted if i not in core.by_chunk]
        if not waiting or any(node not in self.backing_off.get(i, ()) for i in waiting):
            return False
        self.parked_on[node] = (wake, waiting)
        for index in waiting:
            self.parked.setdefault(index, set()).add(node)
        return True

    def _unpark(self, node: int, *, schedule: bool = True) -> None:
        wake, chunks = self.parked_on.pop(node)
        for index in chunks:
            nodes = self.parked.get(index)
            if nodes is not None:
                nodes.discard(node)
                if not nodes:
                    del self.parked[index]
        if schedule:
            self._schedule(node, max(self.net.now, wake))

    def _freed(self, holder: int) -> None:
        """``holder`` has free upload slots: as many nodes parked on its chunks retry."""
        free = self.agents.upload_slots - len(self.net.uploads[holder])
        if free <= 0 or not self.alive[holder]:
            return
        held = self.cores[holder].held
        for index in [i for i in self.parked if i in held]:
            nodes = self.parked.get(index, set())
            while free > 0 and nodes:
                self._unpark(next(iter(nodes)))
                free -= 1
            if free <= 0:
                return

    def _wake_idle(self) -> None:
        for node in [n for n in self.idle if n in self.parked_on]:
            self._unpark(node)
        self._dirty.update(self.idle)
        self.idle.clear()

    # -- carrying out a node's actions ---------------------------------------------------

    def _perform(self, node: int, actions: list[agentsteps.Action]) -> None:
        queue = list(actions)
        while queue:
            queue.extend(self._act(node, queue.pop(0)))

    def _act(self, node: int, action: agentsteps.Action) -> list[agentsteps.Action]:
        core, now, name = self.cores[node], self.net.now, self.names[node]
        if isinstance(action, agentsteps.FindHolders):
            holders = self.tracker.peers(chunk=action.index, node=name, now=now, rng=self.rng)
            return self._job_step(node, action.job, action.index, core.holders(action.job, holders, now=now))
        if isinstance(action, agentsteps.FindSource):
            holders = self.tracker.peers(chunk=action.index, node=name, now=now, rng=self.rng)
            source = self.tracker.stream_source(chunk=action.index, node=name, now=now)
            return self._job_step(node, action.job, action.index, core.sources(action.job, holders, source, now=now))
        if isinstance(action, agentsteps.Fetch):
            return self._fetch(node, action)
        if isinstance(action, agentsteps.AwaitHash):
            self.hash_waits.setdefault(action.index, []).append((node, action.job))
            self._at(action.until, "hash_timeout", node, action.job)
            return []
        if isinstance(action, agentsteps.Store):
            self._at(now + self.agents.process_delay, "landed", node, action.job)
            self._stores[(node, action.job)] = action
            return []
        if isinstance(action, agentsteps.Claim):
            try:
                claimed: list[int] | None = self.tracker.claim_origin(node=name, count=action.count, now=now)
            except tracker.TrackerError:
                claimed = None
            self._sync_pulling()
            return core.claimed(claimed, now=now)
        if isinstance(action, agentsteps.Pull):
            transfer = self.net.start(
                sender=self.origin, receiver=node, chunk=action.index, size=self.sizes[action.index]
            )
            self.origin_bytes += self.sizes[action.index]
            self._track(_Flight(node=node, job=action.job, index=action.index, sender=self.origin, transfer=transfer))
            self.pulls[action.index] = transfer
            self._wake_idle()  # a new chunk to stream
            return []
        if isinstance(action, agentsteps.Cancel):
            self._cancel(node, action.job)
            return []
        if isinstance(action, agentsteps.Report):
            self.reports += 1
            self.tracker.report(reporter=name, peer=action.peer, chunk=action.index, now=now)
            return []
        if isinstance(action, agentsteps.Retake):
            self._at(now + self.agents.start_delay, "taken", node)
            return []
        if isinstance(action, agentsteps.Reuse):
            core.reused(action.job)
        return []  # SetProblem, ClearProblem: the agent shows them; nothing to simulate

    def _job_step(self, node: int, job: int, index: int, actions: list[agentsteps.Action]) -> list[agentsteps.Action]:
        """Carry on; a job that ended without its chunk leaves the node backing off on it."""
        if not any(getattr(a, "job", None) == job for a in actions) and index not in self.cores[node].held:
            self.backing_off.setdefault(index, set()).add(node)
        return actions

    def _fetch(self, node: int, action: agentsteps.Fetch) -> list[agentsteps.Action]:
        core, now = self.cores[node], self.net.now
        sender = int(action.holder.name)
        result: agentsteps.FetchResult | None = None
        if not self.alive[sender]:
            result = agentsteps.Unreachable("dead")
        elif action.stream:
            pull = self.pulls.get(action.index)
            riders = self.streams.setdefault(pull, []) if pull is not None and pull.receiver == sender else None
            if riders is None:
                result = agentsteps.Refused(404)
            elif len(riders) >= self._stream_fit():
                result = agentsteps.Refused(429)
            else:
                flight = _Flight(node=node, job=action.job, index=action.index, sender=sender, stream_of=pull)
                riders.append(flight)
                self.flights[(node, action.job)] = flight
                return []
        elif len(self.net.uploads[sender]) >= self.agents.upload_slots:
            result = agentsteps.Refused(429)
        elif action.index not in self.cores[sender].held:
            result = agentsteps.Refused(404)
        else:
            size = self.sizes[action.index]
            transfer = self.net.start(sender=sender, receiver=node, chunk=action.index, size=size)
            self._track(_Flight(node=node, job=action.job, index=action.index, sender=sender, transfer=transfer))
            return []
        return self._job_step(node, action.job, action.index, core.fetched(action.job, result, now=now))

    def _stream_fit(self) -> int:
        config = self.config
        fit = int(config.node_up // config.origin_rate) - 1 if config.origin_rate > 0 else 0
        return max(0, min(self.agents.stream_slots, fit))

    def _track(self, flight: _Flight) -> None:
        self.flights[(flight.node, flight.job)] = flight
        if flight.transfer is not None:
            self.by_transfer[flight.transfer] = flight

    def _cancel(self, node: int, job: int) -> None:
        flight = self.flights.pop((node, job), None)
        if flight is None:
            return
        if flight.transfer is not None:
            self.by_transfer.pop(flight.transfer, None)
            self.net.cancel(flight.transfer)
            if flight.sender < self.nodes:
                self._dirty.add(flight.sender)
                self._freed(flight.sender)
        if flight.stream_of is not None:
            riders = self.streams.get(flight.stream_of, [])
            if flight in riders:
                riders.remove(flight)

    # -- transfers end, chunks land -------------------------------------------------------

    def _completed(self, transfer: flow.Transfer) -> None:
        flight = self.by_transfer.pop(transfer, None)
        riders = self.streams.pop(transfer, [])
        if flight is None:
            return
        self.flights.pop((flight.node, flight.job), None)
        node, core, now = flight.node, self.cores[flight.node], self.net.now
        if flight.sender == self.origin:
            self.pulls.pop(flight.index, None)
            core.pull_read(flight.job)
            self._perform(node, core.pulled(flight.job, TRUE_HASH.format(flight.index), now=now))
            for rider in riders:
                self.flights.pop((rider.node, rider.job), None)
                self.streamed += 1
                self._got(rider, rider.node)
        else:
            self._dirty.add(flight.sender)  # an upload slot is free
            self._freed(flight.sender)
            self._got(flight, node)
        self._dirty.add(node)

    def _got(self, flight: _Flight, node: int) -> None:
        corrupt = flight.sender in self.liars or node in self.bad_ram
        digest = BAD_HASH if corrupt else TRUE_HASH.format(flight.index)
        got = agentsteps.Got(length=self.sizes[flight.index], digest=digest)
        actions = self.cores[node].fetched(flight.job, got, now=self.net.now)
        self._perform(node, self._job_step(node, flight.job, flight.index, actions))
        self._dirty.add(node)

    def _landed(self, node: int, job: int) -> None:
        store = self._stores.pop((node, job))
        core, now = self.cores[node], self.net.now
        if not self.alive[node]:
            return
        if store.index not in core.held and store.generation == core.generation:
            self._perform(
                node, core.held_chunk(store.index, store.digest, from_origin=store.from_origin, source=store.source)
            )
            self._announce_paced(node)
        self._perform(node, core.stored(job, now=now))
        if not core.missing and self.done_at[node] is None:
            self.done_at[node] = now
            self.pending -= 1
        self._dirty.add(node)

    def _announce_paced(self, node: int) -> None:
        """The agent's early heartbeat, at once or (paced) no sooner than its gap after the last."""
        now = self.net.now
        pace = self.tracker.pace(self.names[node], now=now) if self.tracker.budget is not None else None
        due = self.announced_at[node] + pace.gap if pace is not None else now
        if due <= now:
            self._announce(node)
        elif node not in self.announcing:
            self.announcing.add(node)
            self._at(due, "announce", node)

    def _announce(self, node: int) -> None:
        """The agent's early heartbeat: what it now holds goes to the tracker."""
        core, now = self.cores[node], self.net.now
        self.announced_at[node] = now
        batch, drops = core.take_announcements(4096)
        t = self.tracker
        learned = len(t.hash_log)
        reply = t.heartbeat(
            node=self.names[node],
            now=now,
            load=len(self.net.uploads[node]),
            chunks=batch,
            dropped=drops,
            since=t.log.version,  # the node reads the live view: no changes to carry
            epoch=t.epoch,
        )
        core.announcements_rejected(reply.rejected)  # told again with the next heartbeat, as the agent does
        self._sync_pulling()
        fresh = {i: h for i in t.hash_log[learned:] if (h := t.hashes[i]) is not None}
        if fresh:
            for other, peer_core in enumerate(self.cores):
                if self.alive[other]:
                    peer_core.learn_hashes(fresh)
            for index in fresh:
                for waiter, job in self.hash_waits.pop(index, []):
                    self._perform(waiter, self.cores[waiter].hash_waited(job, now=now))
                    self._dirty.add(waiter)
            self._wake_idle()
        for index, _, _ in batch:
            for other in self.backing_off.pop(index, ()):
                self.cores[other].availability_grew([index])
        if batch:
            self._freed(node)  # a new holder: nodes parked on what it holds retry now
        if batch and any(t.availability()[i] == 1 for i, _, _ in batch):
            self._wake_idle()

    def _hash_timeout(self, node: int, job: int) -> None:
        if self.alive[node]:
            self._perform(node, self.cores[node].hash_waited(job, now=self.net.now))
            self._dirty.add(node)

    def _sync_pulling(self) -> None:
        assigned = self.tracker.assigned
        if assigned.keys() != self.pulling:
            self.pulling.clear()
            self.pulling.update(assigned)

    # -- the tracker's periodic pass, duty, failures ------------------------------------

    def _pass(self) -> None:
        t, now = self.tracker, self.net.now
        for node in range(self.nodes):
            if self.alive[node]:
                t.heartbeat(
                    node=self.names[node],
                    now=now,
                    load=len(self.net.uploads[node]),
                    since=t.log.version,
                    epoch=t.epoch,
                )
        t.purge(now=now)
        self._sync_pulling()
        self._duty_changed()
        overdue = [n for n, (wake, _) in self.parked_on.items() if wake < now - self.agents.offline_after]
        for node in overdue:  # e.g. its only holders died: purged by now, so another answer comes
            self._unpark(node)
        if self.pending:
            self._at(now + self.agents.heartbeat_interval, "pass", -1)

    def _duty_changed(self) -> None:
        t = self.tracker
        duty = {int(n) for n in t.duty}
        for node in duty ^ self.duty:
            if self.alive[node]:
                core = self.cores[node]
                self._perform(node, core.tracker_state(revision=t.revision, confirmed=t.confirmed, duty=node in duty))
                self._dirty.add(node)
        self.duty = duty

    def fail_at(self, *, node: int, when: float) -> None:
        """Make ``node`` fail at time ``when`` (on top of the scenario's random failures)."""
        self._at(when, "fail", node)

    def _schedule_failures(self) -> None:
        count = self.config.failures
        if not count:
            return
        low, high = self.config.fail_window
        config = self.config
        horizon = scenario.t_star(  # the simulated part's own bound: failures land inside a prefix run too
            model_bytes=sum(self.sizes),
            chunk_bytes=config.chunk_bytes,
            nodes=config.nodes,
            origin_rate=config.origin_rate,
            node_rate=min(config.node_up, config.node_down),
        )
        for node in self.rng.sample(range(self.nodes), count):
            self.fail_at(node=node, when=horizon * self.rng.uniform(low, high))

    def _fail(self, node: int) -> None:
        if not self.alive[node]:
            return
        self.alive[node] = False
        if self.done_at[node] is None and node not in self.bad_ram:
            self.pending -= 1
        self.idle.discard(node)
        if node in self.parked_on:
            self._unpark(node)
        for transfer in self.net.uploads[node] + self.net.downloads[node]:
            flight = self.by_transfer.pop(transfer, None)
            self.net.cancel(transfer)
            riders = self.streams.pop(transfer, [])
            if flight is not None:
                self.flights.pop((flight.node, flight.job), None)
            if flight is not None and flight.node != node:
                self._broken(flight)
            for rider in riders:
                self.flights.pop((rider.node, rider.job), None)
                self._broken(rider)
            if flight is not None and flight.sender == self.origin:
                self.pulls.pop(flight.index, None)

    def _broken(self, flight: _Flight) -> None:
        actions = self.cores[flight.node].fetched(flight.job, agentsteps.Broken(0), now=self.net.now)
        self._perform(flight.node, self._job_step(flight.node, flight.job, flight.index, actions))
        self._dirty.add(flight.node)

    def _result(self, wall: float) -> scenario.Result:
        config = self.config
        finish = [t for t, ok in zip(self.done_at, self.alive, strict=True) if ok and t is not None]
        seconds = max(finish) if finish else float("inf")
        extra = config.chunks - config.simulated_chunks
        tail = extra * config.chunk_bytes / config.origin_rate if extra > 0 else 0.0
        finish.sort()
        penalised = {int(n) for n in self.tracker.penalised}
        return scenario.Result(
            scenario=config,
            seconds=seconds + tail,
            simulated_seconds=seconds,
            bound=scenario.bound(config),
            origin_bytes=self.origin_bytes + extra * config.chunk_bytes,
            completed=len(finish),
            failed=self.nodes - sum(self.alive),
            transfers=self.net.started,
            wall_seconds=wall,
            p50_seconds=(finish[len(finish) // 2] + tail) if finish else float("inf"),
            reports=self.reports,
            penalised_liars=len(penalised & self.liars),
            penalised_honest=len(penalised - self.liars),
            ticks=self.ticks,
        )


def simulate(config: scenario.Scenario) -> scenario.Result:
    """Run one scenario to the end (every live node holds every chunk)."""
    return Swarm(config).run()
