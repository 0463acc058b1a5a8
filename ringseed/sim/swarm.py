"""The simulated swarm: agents that choose chunks and peers with ringseed's own protocol code.

Owns the agents' behaviour on top of :mod:`ringseed.sim.flow`. Rules:

- Chunk choice is :func:`ringseed.protocol.choice.rarest_first` over the chunks a node may
  fetch (held somewhere, not held, not in flight), then :func:`~ringseed.protocol.choice.endgame`
  once every missing chunk is in flight; peer choice is
  :func:`~ringseed.protocol.choice.least_loaded` over the chunk's holders, as the tracker's
  ``peers`` does (load = uploads in progress, at most ``peer_limit`` offered). Above
  ``holder_sample`` holders the offer is made from that many holders drawn at random (a
  tracker answering 10,000 names per request would not be cheaper either).
- Origin duty follows the tracker: the earliest registered live node pulls, in index order,
  the chunks nobody holds, ``origin_slots`` at a time, each once while a copy lives inside. The
  next pull starts when a pull's last byte arrives (the agent hands the pipe on before hashing).
- Cut-through (the agent's ``?stream=1``): while a chunk arrives from the origin, up to
  ``stream_slots`` other nodes stream it from the puller, as many as keep up with the origin
  rate on the puller's uplink (``node_up // origin_rate - 1``). In the fluid model they land
  the chunk when its pull ends (plus ``process_delay``); they are drawn among live nodes with a
  free download slot that lack the chunk. Not modelled: the streams' share of the puller's
  uplink and the download slot each stream holds during the pull.
- A node re-plans when one of its downloads ends. A chunk whose offered holders are all busy
  (the agent's 429) is left alone for ``retry_after`` x U(0.5, 1.5) seconds and the next
  rarest is tried at once, as the agent's download loop does; one planning round tries at
  most ``max_tries`` chunks (one rarest-first ordering, not one call per failure). A node with free slots and
  nothing it may fetch ("starved") re-plans when some chunk gets its first copy, after
  ``notify_delay`` (the agent's heartbeat/availability latency). A received chunk is held,
  announced and served ``process_delay`` after its last byte (hashing, storing, announcing;
  its download slot stays taken until then); origin duty starts after ``start_delay``.
- A failed node stops at once: its transfers are cut (receivers re-plan), its copies stop
  counting; the tracker notices after ``offline_after`` and hands its origin duty on. Failure
  times are drawn in ``fail_window`` x the bound of the simulated part (the prefix, if any).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Iterator

from ringseed.protocol import choice
from ringseed.sim import flow, scenario, state


class Swarm:
    """One run of a :class:`ringseed.sim.scenario.Scenario`."""

    def __init__(self, config: scenario.Scenario) -> None:
        self.config = config
        self.agents = config.agents
        self.rng = random.Random(config.seed)
        count = config.simulated_chunks
        sizes = [config.chunk_bytes] * count
        if config.prefix_chunks is None or config.prefix_chunks >= config.chunks:
            sizes[-1] = config.model_bytes - config.chunk_bytes * (count - 1)
        self.sizes = sizes
        self.nodes = config.nodes
        self.origin = config.nodes  # the external source is endpoint N
        up = [config.node_up] * config.nodes + [config.origin_rate]
        down = [config.node_down] * config.nodes + [0.0]
        self.net = flow.Network(up=up, down=down)
        self.held = state.Holdings(nodes=config.nodes, chunks=count)
        self.inflight: list[dict[int, list[flow.Transfer]]] = [{} for _ in range(config.nodes)]
        self.starved = state.RandomSet()
        self.backoff: list[dict[int, float]] = [{} for _ in range(config.nodes)]
        self.waiters: dict[int, state.RandomSet] = {}  # chunk -> nodes whose holders were all busy
        self.done_at: list[float | None] = [None] * config.nodes
        self.alive = [True] * config.nodes
        self.duty: list[int] = [0] if config.nodes else []
        self.assigned: dict[int, int] = {}
        self.origin_bytes = 0
        self._timers: list[tuple[float, int, str, int, int]] = []
        self.verifying = [0] * config.nodes
        self._seq = itertools.count()
        self._woken: set[int] = set()
        self.pending = config.nodes  # live nodes still missing chunks
        self.streamed = 0  # chunk copies that arrived by cut-through

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> scenario.Result:
        started = time.perf_counter()
        self._schedule_failures()
        self._at(self.agents.start_delay, "origin", 0)
        for node in range(self.nodes):
            self._plan(node)
        for _ in self._events():
            if self._finished():
                break
        return self._result(time.perf_counter() - started)

    def _events(self) -> Iterator[None]:
        net, timers = self.net, self._timers
        while True:
            next_transfer = net.next_time()
            next_timer = timers[0][0] if timers else float("inf")
            if next_transfer == next_timer == float("inf"):
                if not self._kick():
                    return
                continue
            if next_timer <= next_transfer:
                when, _, kind, node, chunk = heapq.heappop(timers)
                net.advance(when)
                self._timer(kind, node, chunk)
            else:
                self._completed(net.pop())
            yield None

    def _kick(self) -> bool:
        """Nothing in flight and no timer: every waiting node looks again (ends a stall)."""
        stuck = self.starved.drain()
        for waiting in self.waiters.values():
            stuck += waiting.drain()
        self.waiters.clear()
        for node in stuck:
            self._plan(node)
        return bool(stuck) and (self.net.next_time() < float("inf") or bool(self._timers))

    def _finished(self) -> bool:
        return self.pending == 0

    def _at(self, when: float, kind: str, node: int, chunk: int = -1) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), kind, node, chunk))

    def _timer(self, kind: str, node: int, chunk: int) -> None:
        if kind == "landed":
            self.verifying[node] -= 1
            self._landed(node, chunk)
        elif kind == "origin":
            self._origin_duty()
        elif kind == "plan":
            self._woken.discard(node)
            self._plan(node)
        elif kind == "fail":
            self._fail(node)
        elif kind == "purge":
            self._purge(node)

    # -- transfers -----------------------------------------------------------------------

    def _completed(self, transfer: flow.Transfer) -> None:
        """The last byte arrived: the sender's slot is free; the chunk lands after ``process_delay``."""
        node, chunk = transfer.receiver, transfer.chunk
        if transfer.sender == self.origin:
            self._streamed(puller=node, chunk=chunk)
        duplicates = self.inflight[node].get(chunk, [])
        self.inflight[node][chunk] = []  # verifying: not asked for again, not yet held
        for other in duplicates:
            self.net.cancel(other)
        for sender in {transfer.sender, *(t.sender for t in duplicates)}:
            self._freed(sender)
        if self.agents.process_delay > 0:
            self.verifying[node] += 1
            self._at(self.net.now + self.agents.process_delay, "landed", node, chunk)
        else:
            self._landed(node, chunk)

    def _streamed(self, *, puller: int, chunk: int) -> None:
        """The pull of ``chunk`` ends: its stream receivers end with it; the next pull starts now."""
        agents = self.agents
        fit = int(self.config.node_up // self.config.origin_rate) - 1 if self.config.origin_rate > 0 else 0
        count = min(agents.stream_slots, fit)
        chosen: list[int] = []
        for node in self.rng.sample(range(self.nodes), min(self.nodes, 4 * count)) if count > 0 else []:
            if len(chosen) >= count:
                break
            busy = len(self.net.downloads[node]) + self.verifying[node]
            if (
                node != puller
                and self.alive[node]
                and self.done_at[node] is None
                and busy < agents.download_slots
                and not self.held.has(node, chunk)
                and chunk not in self.inflight[node]
            ):
                chosen.append(node)
        for node in chosen:
            self.inflight[node][chunk] = []  # verifying: not asked for again, not yet held
            self.verifying[node] += 1
            self._at(self.net.now + agents.process_delay, "landed", node, chunk)
        self.streamed += len(chosen)
        if puller in self.duty:
            self._origin_duty()

    def _landed(self, node: int, chunk: int) -> None:
        """The chunk is verified and stored: held, announced, served; the agent plans again."""
        self.inflight[node].pop(chunk, None)
        if not self.alive[node]:
            return
        self.assigned.pop(chunk, None)
        first = False
        if not self.held.has(node, chunk):
            self.backoff[node].pop(chunk, None)
            first = self.held.add(node, chunk)
            if self.held.complete(node):
                self.done_at[node] = self.net.now
                self.pending -= 1
        if node in self.duty:
            self._origin_duty()
        self._plan(node)
        if first:
            self._wake(self.starved.drain())
        self._freed(node)

    def _start(self, *, sender: int, node: int, chunk: int) -> None:
        transfer = self.net.start(sender=sender, receiver=node, chunk=chunk, size=self.sizes[chunk])
        self.inflight[node].setdefault(chunk, []).append(transfer)
        if sender == self.origin:
            self.origin_bytes += self.sizes[chunk]

    def _wake(self, nodes: list[int]) -> None:
        when = self.net.now + self.agents.notify_delay
        for node in nodes:
            if node not in self._woken:
                self._woken.add(node)
                self._at(when, "plan", node)

    # -- an agent's decisions ------------------------------------------------------------

    def _plan(self, node: int) -> None:
        """The agent's download loop: rarest first; a chunk whose holders are all busy backs off."""
        if not self.alive[node] or self.done_at[node] is not None:
            return
        free = self.agents.download_slots - len(self.net.downloads[node]) - self.verifying[node]
        if free <= 0:
            return
        now, backoff = self.net.now, self.backoff[node]
        candidates = [c for c in self.held.candidates(node, busy=self.inflight[node]) if backoff.get(c, 0.0) <= now]
        order = choice.rarest_first(
            candidates=candidates, availability=self.held.avail, count=self.agents.max_tries, rng=self.rng
        )
        for chunk in order:
            if not free:
                break
            if self._fetch(node, chunk, avoid=()):
                free -= 1
            else:
                backoff[chunk] = now + self.agents.retry_after * self.rng.uniform(0.5, 1.5)
                self.waiters.setdefault(chunk, state.RandomSet()).add(node)
        if free:
            free -= self._endgame(node, free)
        self._park(node, free)

    def _park(self, node: int, free: int) -> None:
        """A node with free slots waits: for a back-off to expire, or for a chunk's first copy."""
        self.starved.discard(node)
        if not free:
            return
        backoff, now = self.backoff[node], self.net.now
        for chunk in [c for c, t in backoff.items() if t <= now]:
            del backoff[chunk]
        if not backoff and self.held.count[node] + len(self.inflight[node]) < len(self.sizes):
            self.starved.add(node)

    def _freed(self, holder: int) -> None:
        """``holder`` has a free upload slot or a new copy: blocked nodes that want its chunks retry.

        A blocked agent retries when its back-off ends; a retry can only succeed once a holder
        of its chunk has a free slot, so the retry is scheduled then (at the back-off's end or
        now, whichever is later) instead of polling: same outcome, far fewer events.
        """
        if holder >= self.nodes or not self.alive[holder]:
            return
        free = self.agents.upload_slots - len(self.net.uploads[holder])
        for chunk in [c for c in self.waiters if self.held.has(holder, c)]:
            waiting = self.waiters[chunk]
            while free > 0 and len(waiting):
                (node,) = waiting.take(1, self.rng)
                if self.alive[node] and not self.held.has(node, chunk):
                    self._at(max(self.net.now, self.backoff[node].get(chunk, 0.0)), "plan", node)
                    free -= 1
            if not len(waiting):
                del self.waiters[chunk]
            if free <= 0:
                return

    def _fetch(self, node: int, chunk: int, *, avoid: tuple[str, ...]) -> bool:
        offered = self._peers(node, chunk, avoid=avoid)
        for holder in offered:
            sender = int(holder.name)
            if len(self.net.uploads[sender]) < self.agents.upload_slots:
                self._start(sender=sender, node=node, chunk=chunk)
                return True
        return False

    def _peers(self, node: int, chunk: int, *, avoid: tuple[str, ...]) -> list[choice.Holder]:
        """What the tracker's ``peers`` offers: least-loaded live holders, at most ``peer_limit``."""
        names = self.held.sample_holders(chunk, limit=self.agents.holder_sample, alive=self.alive, rng=self.rng)
        uploads, slots = self.net.uploads, self.agents.upload_slots
        if all(len(uploads[h]) >= slots for h in names):
            return []  # every offered holder would answer 429: skip building the offer
        holders = [choice.Holder(name=str(h), url="", load=len(uploads[h])) for h in names if h != node]
        return choice.least_loaded(holders, avoid=avoid, rng=self.rng)[: self.agents.peer_limit]

    def _endgame(self, node: int, free: int) -> int:
        flying = self.inflight[node]
        missing = len(self.sizes) - self.held.count[node]
        if not flying or missing != len(flying):
            return 0
        counts = {chunk: len(transfers) for chunk, transfers in flying.items() if transfers}
        started = 0
        for chunk in choice.endgame(missing=list(counts), in_flight=counts, free_slots=free):
            avoid = tuple(str(t.sender) for t in flying[chunk])
            started += self._fetch(node, chunk, avoid=avoid)
        return started

    # -- origin duty and failures --------------------------------------------------------

    def _origin_duty(self) -> None:
        for node in self.duty:
            pulling = sum(1 for t in self.net.downloads[node] if t.sender == self.origin)
            want = self.agents.origin_slots - pulling
            for chunk in self.held.unheld(want, skip=self.assigned):
                self.assigned[chunk] = node
                self._start(sender=self.origin, node=node, chunk=chunk)

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
        self.alive[node] = False
        if self.done_at[node] is None:
            self.pending -= 1
        self.starved.discard(node)
        self.held.drop(node)
        cut = self.net.uploads[node] + self.net.downloads[node]
        for transfer in cut:
            self.net.cancel(transfer)
            self._forget(transfer)
        for transfer in cut:
            if transfer.receiver != node and transfer.receiver != self.origin:
                self._plan(transfer.receiver)
            self._freed(transfer.sender)
        self._at(self.net.now + self.agents.offline_after, "purge", node)

    def _forget(self, transfer: flow.Transfer) -> None:
        if transfer.receiver >= self.nodes:
            return
        flying = self.inflight[transfer.receiver]
        left = [t for t in flying.get(transfer.chunk, []) if t is not transfer]
        if left:
            flying[transfer.chunk] = left
        else:
            flying.pop(transfer.chunk, None)

    def _purge(self, node: int) -> None:
        """The tracker drops the silent node: its origin assignments and duty move on."""
        self.assigned = {c: n for c, n in self.assigned.items() if n != node}
        if node in self.duty:
            self.duty.remove(node)
            heir = next((n for n in range(self.nodes) if self.alive[n] and n not in self.duty), None)
            if heir is not None:
                self.duty.append(heir)
        self._origin_duty()

    def _result(self, wall: float) -> scenario.Result:
        config = self.config
        finish = [t for t, ok in zip(self.done_at, self.alive, strict=True) if ok and t is not None]
        seconds = max(finish) if finish else float("inf")
        extra = config.chunks - config.simulated_chunks
        tail = extra * config.chunk_bytes / config.origin_rate if extra > 0 else 0.0
        finish.sort()
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
        )


def simulate(config: scenario.Scenario) -> scenario.Result:
    """Run one scenario to the end (every live node holds every chunk)."""
    return Swarm(config).run()
