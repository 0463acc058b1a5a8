"""Benchmark: the real tracker process on one core against thousands of emulated agents.

Runs ``ringseed master --role tracker`` as its own process pinned to one core (``taskset``) and a
load generator in separate processes pinned to another core. The generator speaks the agent's
protocol over HTTP/1.1 keep-alive connections (one per emulated agent, raw asyncio streams so that
the generator stays cheaper than the tracker): registration, heartbeats every
``--interval`` seconds carrying the announcements of what the agent got since its last one
(``[index, null, from]``; the origin-duty agent's carry hashes), and optionally one peer query
(``GET /v1/peers``) per chunk an agent gets, as today's agent does before each fetch.

The swarm progresses as a 500 GB, 7,451-chunk model does when origin and node links run at
``--link`` (10 Gbit/s): the origin-duty agent (the first registered) claims chunks and announces
them with their hashes at the origin rate; every other agent gets each chunk a little after (its
lag, about log2(N) chunk times, drawn per agent), never before a reply told it the chunk's hash
(an agent holds only what it verified), so availability levels climb as they would.
``--streams`` agents per pulled chunk stream it and wait for its hash, as agents do: in ``full``
mode (the behaviour before issue 11) they heartbeat every 50 ms until the hash arrives, in the
``delta`` and ``paced`` modes they long-poll ``POST /v1/watch``.

Modes: ``full`` (``--heartbeat-replies full``: the whole vector of counts whenever it changed),
``delta`` (changes since the agent's version, issue 11 part 3; every agent heartbeats each
``--interval``, the tracker sets no pace: ``--heartbeat-rate 0``) and ``paced`` (the tracker
paces the swarm to ``--rate`` heartbeats per second; each agent heartbeats at the pace the
replies name, early, ``early_gap`` after its last one, when it verified a chunk since, as the
real agent does). Before pacing the real agent heartbeat up to 20 times a second while it
verified chunks; ``delta`` is the kinder every-``--interval`` model of it.

Printed per (nodes, mode), measured over a window after a warm-up: heartbeat latency p50/p99
(from the time the heartbeat was due, so a late send counts), peer-query latency, tracker CPU
(cores, from ``/proc/<pid>/stat``, and CPU microseconds per request), the generator's own CPU
(its processes share the other core: if it is near 1.0 the latencies include its own delays),
the tracker's own time per heartbeat (read to response written, timed inside the tracker process:
its p50/p99) and, for the slowest 1 % of heartbeats, how much of it was the generator's send lag,
the tracker's queue (sent to read), the tracker's own time and the generator's read lag,
requests per second, bytes per heartbeat reply (mean, p50, p99) split into hashes / availability
/ the rest, announced chunks rejected, and the load average before and after (the machine may be
shared: CPU per request is the robust figure, latencies include every wait for a core).

    .venv/bin/python -m bench.tracker [--nodes 1000,10000] [--modes delta,paced] [--rate 1000]
        [--chunk-mib 64] [--peer-queries] [--warmup 20] [--measure 30] [--interval 2] [--workers 2]
        [--tracker-core 0 --load-core 1] [--json FILE] [--profile FILE]

With ``--stalls`` and ``BENCH_GC_YOUNG=1`` in the environment, the tracker's stalls record also
keeps, for each young collection over 20 ms of CPU, how many objects it walked and the largest
containers among them (``slow_young``); the probe walks the generation at every collection, so
that run's latencies are not figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ringseed.protocol import announcements

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
CHUNK = 64 * MiB
TOTAL = 500 * 10**9
LINK = 10e9 / 8  # bytes/s
HEX = "0123456789abcdef"
VERSION = re.compile(rb'"version":(-?\d+)')
REJECTED = re.compile(rb'"rejected":\[([^\]]*)\]')
RUN = re.compile(rb'\[(\d+),"([A-Za-z0-9+/]*)(=*)"\]')
TAGS_PER_AGENT = 100_000  # heartbeat ids per agent (a worker's ids start at its first agent's block)
PACE = re.compile(rb'"heartbeat_interval":([0-9.e+-]+),"early_gap":([0-9.e+-]+)')


@dataclass(frozen=True)
class Plan:
    nodes: int
    mode: str
    interval: float
    peer_queries: bool
    streams: int
    warmup: float
    measure: float
    rate: int = 1000
    jitter: float = 0.5
    wire: str = "items"  # announcements one item per chunk ("items", before session 6) or "runs"
    chunk: int = CHUNK
    total: int = TOTAL
    link: float = LINK

    @property
    def chunks(self) -> int:
        return math.ceil(self.total / self.chunk)

    @property
    def origin_rate(self) -> float:
        """Chunks per second leaving the origin (origin link = node link)."""
        return self.link / self.chunk

    def layout(self) -> dict[str, Any]:
        files = [{"path": "model.bin", "size": self.total, "mode": 420}]
        return {"version": 1, "chunk_size": self.chunk, "files": files}


def digest(index: int) -> str:
    return format(index, "064x")


def name_of(i: int) -> str:
    return f"node-{i:05d}"


# -- the generator (one process per worker) -------------------------------------------------


@dataclass
class Samples:
    heartbeat: list[float] = field(default_factory=list)
    peers: list[float] = field(default_factory=list)
    watch: list[float] = field(default_factory=list)
    reply_bytes: list[int] = field(default_factory=list)
    hash_bytes: list[int] = field(default_factory=list)
    avail_bytes: list[int] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)  # heartbeat sent - due: the generator's own delay
    loop_lag: list[float] = field(default_factory=list)  # the generator's event loop: a 10 ms tick's overshoot
    due_per_s: list[int] = field(default_factory=list)  # heartbeats due in each second of the window (offered load)
    trace: list[tuple[int, float, float, float]] = field(default_factory=list)  # (id, due, sent, done) per heartbeat
    window_cpu: float = 0.0  # the generator's CPU seconds within the window
    rejected: int = 0  # chunks announced before the tracker knew their hash (announced again)
    errors: int = 0
    requests: int = 0
    measured: int = 0  # requests sent within the measurement window


class Connection:
    """One keep-alive HTTP/1.1 connection to the tracker; requests one at a time."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None = None, tag: int = -1) -> tuple[int, bytes]:
        """One request; ``tag`` (>= 0) goes as ``X-Bench-Id``, for the tracker's own timing of it."""
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None and self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n".encode() + self.auth
        if tag >= 0:
            head += b"X-Bench-Id: %d\r\n" % tag
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        self.writer.write(head + b"\r\n" + (body or b""))
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = await self.reader.readexactly(length)
        return int(status_line.split(b" ", 2)[1]), payload


class Worker:
    """Emulates agents ``lo .. hi - 1`` of the plan."""

    def __init__(self, plan: Plan, *, host: str, port: int, token: str, lo: int, hi: int, start: float) -> None:
        self.plan, self.host, self.port, self.token = plan, host, port, token
        self.lo, self.hi, self.start = lo, hi, start
        self.samples = Samples(due_per_s=[0] * math.ceil(plan.measure))
        self.window = (start + plan.warmup, start + plan.warmup + plan.measure)
        self.rng = random.Random(lo)
        tau = plan.chunk / plan.link
        depth = max(1.0, math.log2(max(2, plan.nodes)))
        # each agent gets chunk c at t_c + lag: about log2(N) chunk times after the origin, spread
        self.lag = {i: 0.3 + depth * tau * self.rng.uniform(0.5, 1.5) for i in range(lo, hi)}
        self.epoch = ""
        self.since: dict[int, int] = {}  # each agent's view version (its heartbeats and waits share it)
        self.known: dict[int, int] = {}  # each agent knows the hashes of chunks 0 .. known - 1
        self.registering = asyncio.Semaphore(100)
        self.pace: dict[int, tuple[float, float]] = {}  # each agent's (interval, gap) as last told
        self.tags = itertools.count(lo * TAGS_PER_AGENT)  # heartbeat ids, unique across workers

    def in_window(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]

    def counted(self) -> None:
        self.samples.requests += 1
        self.samples.measured += self.in_window(time.time())

    def pulled_at(self, index: int) -> float:
        return self.start + (index + 1) / self.plan.origin_rate

    def got_by(self, t: float, agent: int) -> int:
        """How many chunks ``agent`` holds at time ``t`` (chunks 0 .. n-1)."""
        if agent == 0:
            return max(0, min(self.plan.chunks, math.floor((t - self.start) * self.plan.origin_rate)))
        held = math.floor((t - self.lag[agent] - self.start) * self.plan.origin_rate)
        return max(0, min(self.plan.chunks, held))

    async def register(self, conn: Connection, agent: int) -> None:
        url = f"http://10.0.{agent // 250}.{agent % 250}:8471"
        body = {"node": name_of(agent), "url": url, "session": "s", "layout": self.plan.layout()}
        status, payload = await conn.request("POST", "/v1/register", json.dumps(body).encode())
        if status != 200:
            raise RuntimeError(f"register {agent}: {status} {payload[:200]!r}")
        reply = json.loads(payload)
        self.epoch = reply["epoch"]
        if self.plan.mode == "paced":  # the agent takes its first pace from the registration
            self.pace[agent] = (float(reply["heartbeat_interval"]), float(reply["early_gap"]))

    async def run_agent(self, agent: int, registered: asyncio.Event | None) -> None:
        conn = Connection(self.host, self.port, self.token)
        async with self.registering:  # a bounded number of connections opening at once
            await self.register(conn, agent)
        if agent == 0:
            body = {"node": name_of(0), "layout": self.plan.layout()}
            await conn.request("PUT", "/v1/manifest", json.dumps(body).encode())
        if registered is not None:
            registered.set()
        await asyncio.sleep(max(0.0, self.start - time.time()))
        if agent == 0:
            await self.origin_duty(conn)
        else:
            await self.follow(conn, agent)

    async def heartbeat(
        self, conn: Connection, agent: int, since: int | None, chunks: list[list[Any]], due: float
    ) -> tuple[int | None, list[int]]:
        """One heartbeat; returns the view version it carried and the chunks it rejected (and
        keeps the pace it named)."""
        message: dict[str, Any] = {"node": name_of(agent), "since": since, "epoch": self.epoch, "load": 1}
        plain = [c[0] for c in chunks if c[1] is None]
        if self.plan.wire == "runs":  # (as the agent since session 6: views' chunk lists as runs too)
            message["index_runs"] = True
        if self.plan.wire == "runs" and plain:  # (the agent's announcements.pack, without its per-chunk step)
            message["chunks"] = [c for c in chunks if c[1] is not None]
            message["runs"] = announcements.runs_of(plain)
            message["sources"] = [[i, name_of(self.rng.randrange(0, self.plan.nodes))] for i in plain[:16]]
        else:
            message["chunks"] = chunks
        body = json.dumps(message)
        tag = next(self.tags)
        sent = time.time()
        status, payload = await conn.request("POST", "/v1/heartbeat", body.encode(), tag=tag)
        done = time.time()
        self.counted()
        if status != 200:
            self.samples.errors += 1
            return since, [i for i, _, _ in chunks]
        if self.in_window(due):
            self.samples.heartbeat.append(done - due)
            self.samples.send_lag.append(sent - due)
            self.samples.trace.append((tag, due, sent, done))
            self.samples.due_per_s[int(due - self.window[0])] += 1
            self.samples.reply_bytes.append(len(payload))
            self.samples.hash_bytes.append(part_bytes(payload, b'"hash_runs":'))
            self.samples.avail_bytes.append(part_bytes(payload, b'"avail":') + part_bytes(payload, b'"availability":'))
        refused = REJECTED.search(payload)
        rejected = [int(i) for i in refused.group(1).split(b",")] if refused and refused.group(1) else []
        self.samples.rejected += len(rejected)
        self.learn(agent, payload)
        paced = PACE.search(payload)
        if paced:
            self.pace[agent] = (float(paced.group(1)), float(paced.group(2)))
        found = VERSION.search(payload)
        return (int(found.group(1)) if found else since), rejected

    def learn(self, agent: int, payload: bytes) -> list[range]:
        """The hashes a reply told ``agent`` (the duty node learns them in chunk order), as ranges."""
        told = hash_ranges(payload)
        if told:
            self.known[agent] = max(self.known.get(agent, 0), max(r.stop for r in told))
        return told

    async def origin_duty(self, conn: Connection) -> None:
        """Claims chunks and announces each with its hash when it has been pulled."""
        plan, sent, since = self.plan, 0, None
        last_beat = 0.0
        while sent < plan.chunks and time.time() < self.window[1] + 2 * plan.interval:
            now = time.time()
            have = self.got_by(now, 0)
            if have > sent or now - last_beat >= plan.interval:
                claim = json.dumps({"node": name_of(0), "count": 64}).encode()
                await conn.request("POST", "/v1/origin/claim", claim)
                chunks = [[i, digest(i), None] for i in range(sent, have)]
                since, _ = await self.heartbeat(conn, 0, since, chunks, due=now)
                sent, last_beat = have, now
            await asyncio.sleep(min(0.05, plan.interval))

    async def follow(self, conn: Connection, agent: int) -> None:
        """Heartbeats of one agent: every ``--interval`` (modes full, delta: the agent before
        pacing, without its early heartbeats), or (paced) at the pace the tracker names: early,
        ``gap`` after the last, when it got chunks since, else ``interval`` after it."""
        plan, rng = self.plan, self.rng
        sent, retry = 0, list[int]()
        due = self.start + rng.uniform(0, self.pace.get(agent, (plan.interval, 0.0))[0])
        while sent < plan.chunks and due < self.window[1] + plan.interval:
            await asyncio.sleep(max(0.0, due - time.time()))
            have = max(sent, min(self.got_by(due, agent), self.known.get(agent, 0)))  # verified: hash known
            fresh = list(range(sent, have))
            if plan.peer_queries:
                for index in fresh:
                    t0 = time.time()
                    await conn.request("GET", f"/v1/peers?chunk={index}&node={name_of(agent)}")
                    self.counted()
                    if self.in_window(t0):
                        self.samples.peers.append(time.time() - t0)
            if plan.wire == "runs":  # (the sources are drawn in heartbeat(): 16 of them, not one per chunk)
                chunks = [[i, None, None] for i in retry + fresh]
            else:
                chunks = [[i, None, name_of(rng.randrange(0, plan.nodes))] for i in retry + fresh]
            version, rejected = await self.heartbeat(conn, agent, self.since.get(agent), chunks, due=due)
            self.absorbed(agent, version)
            retry = rejected  # an agent holds a chunk only once it knows its hash: again next time
            sent = have
            due = self.next_due(agent, due, sent)

    def next_due(self, agent: int, last: float, sent: int) -> float:
        """When ``agent`` heartbeats next. Paced: at its next verified chunk (it verifies only
        chunks whose hash a reply told it) but no sooner than ``gap`` after the last, else
        ``interval`` after it (it does not watch: a starved agent waits for its regular beat)."""
        if self.plan.mode != "paced" or agent not in self.pace:
            return last + self.plan.interval
        interval, gap = self.pace[agent]
        if self.known.get(agent, 0) <= sent:
            return last + interval
        verifies = self.start + self.lag[agent] + (sent + 1) / self.plan.origin_rate
        return min(last + interval, max(last + gap, verifies))

    def absorbed(self, agent: int, version: int | None) -> None:
        if version is not None:
            self.since[agent] = max(version, self.since.get(agent, version))

    async def streamers(self) -> None:
        """``streams`` agents per pulled chunk wait for its hash: polls (full) or a watch (delta)."""
        plan = self.plan
        if plan.streams <= 0 or self.lo != 0:
            return
        conns = [Connection(self.host, self.port, self.token) for _ in range(plan.streams)]
        await asyncio.sleep(max(0.0, self.start - time.time()))
        index = 0
        while index < plan.chunks and time.time() < self.window[1]:
            pulled = self.pulled_at(index)
            await asyncio.sleep(max(0.0, pulled - plan.chunk / plan.link - time.time()))  # its pull starts
            mine = self.hi - self.lo - 1  # our agents other than the duty node
            waiting = [
                asyncio.create_task(self.wait_hash(conn, self.lo + 1 + (index * plan.streams + k) % mine, index))
                for k, conn in enumerate(conns)
            ]
            await asyncio.gather(*waiting, return_exceptions=True)
            index += max(1, math.ceil((time.time() - pulled) * plan.origin_rate))

    async def wait_hash(self, conn: Connection, agent: int, index: int) -> None:
        """Until the tracker tells ``agent`` the hash of ``index``, as the agent does: before
        issue 11 a heartbeat every 50 ms, now a watch of the chunk (again after unrelated news)."""
        t0 = time.time()
        deadline = t0 + 5.0
        while time.time() < deadline:
            since = self.since.get(agent)
            if self.plan.mode != "full":
                body = {"node": name_of(agent), "since": since, "epoch": self.epoch, "chunks": [index], "wait": 5.0}
                if self.plan.wire == "runs":
                    body["index_runs"] = True
                status, payload = await conn.request("POST", "/v1/watch", json.dumps(body).encode())
            else:
                body = {"node": name_of(agent), "since": since, "epoch": self.epoch, "chunks": []}
                status, payload = await conn.request("POST", "/v1/heartbeat", json.dumps(body).encode())
            self.counted()
            found = VERSION.search(payload)
            self.absorbed(agent, int(found.group(1)) if found else None)
            if status != 200 or any(index in r for r in self.learn(agent, payload)):
                break
            if self.plan.mode == "full":
                await asyncio.sleep(0.05)
        if self.in_window(t0):
            self.samples.watch.append(time.time() - t0)

    async def ticker(self, tick: float = 0.01) -> None:
        """The generator's own event-loop lag over the window: how late a 10 ms sleep wakes (when
        it is large, latencies include the generator's own delays, not only the tracker's)."""
        await asyncio.sleep(max(0.0, self.window[0] - time.time()))
        cpu0 = time.process_time()
        while time.time() < self.window[1]:
            t0 = time.perf_counter()
            await asyncio.sleep(tick)
            self.samples.loop_lag.append(time.perf_counter() - t0 - tick)
        self.samples.window_cpu = time.process_time() - cpu0

    async def run(self) -> Samples:
        registered = asyncio.Event()
        agents = list(range(self.lo, self.hi))
        tasks: list[asyncio.Task[None]] = []
        if agents and agents[0] == 0:  # the first registered holds origin duty
            tasks.append(asyncio.create_task(self.run_agent(0, registered)))
            await registered.wait()
            agents = agents[1:]
        tasks += [asyncio.create_task(self.run_agent(a, None)) for a in agents]
        tasks.append(asyncio.create_task(self.streamers()))
        tasks.append(asyncio.create_task(self.ticker()))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        self.samples.errors += sum(1 for r in results if isinstance(r, BaseException))
        failures = [r for r in results if isinstance(r, BaseException)][:3]
        for failure in failures:
            print(f"worker {self.lo}: {failure!r}", file=sys.stderr)
        return self.samples


PARTS = (b'"availability":', b'"avail":', b'"hash_runs":', b'"pulling":', b'"pulling_stopped":')


def hash_ranges(payload: bytes) -> list[range]:
    """The chunks whose hashes a reply's ``hash_runs`` carry (sizes from the base64 lengths only)."""
    at = payload.find(b'"hash_runs":[')
    if at < 0:
        return []
    end = payload.find(b"]]", at) + 2
    out = []
    for first, text, pad in RUN.findall(payload, at, end):
        count = ((len(text) + len(pad)) * 3 // 4 - len(pad)) // 32
        out.append(range(int(first), int(first) + count))
    return out


def part_bytes(payload: bytes, key: bytes) -> int:
    """Bytes of one part of a view (its key to the next part; the view's parts come in the order
    of ``PARTS``, last in the reply), found with ``bytes.find`` only: the generator stays cheap."""
    at = payload.find(key)
    if at < 0:
        return 0
    later = [payload.find(k, at + len(key)) for k in PARTS[PARTS.index(key) + 1 :]]
    end = min([p for p in later if p >= 0], default=len(payload) - 1)
    return end - at


def worker_main(args: argparse.Namespace) -> None:
    plan = Plan(**json.loads(args.plan))
    worker = Worker(plan, host="127.0.0.1", port=args.port, token=args.token, lo=args.lo, hi=args.hi, start=args.start)
    cpu0 = time.process_time()
    samples = asyncio.run(worker.run())
    result = asdict(samples)
    result["cpu_seconds"] = time.process_time() - cpu0
    print(json.dumps(result))


# -- the tracker's own timing and stalls ------------------------------------------------------


def timed_heartbeats() -> tuple[type[Any], dict[int, tuple[float, float]]]:
    """An aiohttp access logger that keeps, for each request tagged ``X-Bench-Id``, the wall times
    at which the tracker read it (aiohttp took the parsed request off the connection's queue) and
    had written its response (``write_eof`` returned): the tracker's own time for it, which the
    generator's delays do not touch. The bench alone installs it (:func:`shim_main`)."""
    from aiohttp import abc

    timed: dict[int, tuple[float, float]] = {}

    class Timing(abc.AbstractAccessLogger):
        def log(self, request: Any, response: Any, time_taken: float) -> None:
            tag = request.headers.get("X-Bench-Id")
            if tag is not None:
                written = time.time()
                timed[int(tag)] = (written - time_taken, written)

    return Timing, timed


def shim_main(out: str, argv: list[str], *, stalls: bool) -> int:
    """Runs ``ringseed.cli`` with ``argv`` and records, to ``out`` at exit, the tracker's own
    time per tagged heartbeat (:func:`timed_heartbeats`) and, with ``stalls``, its event-loop lag
    (how late a 10 ms timer inside its loop fires: every request waits that long too) and its
    garbage-collector pauses, each as ``[wall time, seconds]`` above 1 ms."""
    import atexit
    import gc
    import logging

    from aiohttp import web as aioweb

    from ringseed import cli

    timing, timed = timed_heartbeats()
    run_app = aioweb.run_app

    def timed_run_app(app: Any, **kwargs: Any) -> None:
        kwargs.update(access_log=logging.getLogger("bench.tracker.timing"), access_log_class=timing)
        run_app(app, **kwargs)

    aioweb.run_app = timed_run_app  # (ringseed.master.command calls aiohttp.web.run_app)

    lags: list[tuple[float, float]] = []
    pauses: list[tuple[float, int, float]] = []
    ticks = [0]
    started = [0.0]

    async def ticker(tick: float = 0.01) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(tick)
            ticks[0] += 1
            lag = time.perf_counter() - t0 - tick
            if lag > 0.001:
                lags.append((time.time(), lag))

    cpu = [0.0]

    # BENCH_GC_YOUNG=1: what each young collection walked (object count, the largest containers),
    # kept for the slow ones; it walks the generation at every collection, so latencies are not figures then
    young: list[Any] = [None]
    slow_young: list[Any] = []
    probe = os.environ.get("BENCH_GC_YOUNG") == "1"

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if probe and info["generation"] < 2:
                objects = gc.get_objects(generation=info["generation"])
                sizes = sorted(((len(o), type(o).__name__) for o in objects if hasattr(o, "__len__")), reverse=True)
                young[0] = (len(objects), sizes[:5])
                del objects
            started[0], cpu[0] = time.perf_counter(), time.thread_time()
        elif time.perf_counter() - started[0] > 0.001:
            wall, spent = time.perf_counter() - started[0], time.thread_time() - cpu[0]
            pauses.append((time.time(), info["generation"], wall, spent))
            if probe and info["generation"] < 2 and spent > 0.02:
                slow_young.append((time.time(), info["generation"], spent, young[0], info["collected"]))

    class Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            loop = super().new_event_loop()
            loop.call_soon(lambda: loop.create_task(ticker()))
            return loop

    def dump() -> None:
        import collections

        tracked = collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(12)
        sizes = [len(gc.get_objects(generation=g)) for g in range(3)]
        data = {"lags": lags, "gc": pauses, "ticks": ticks[0], "tracked": tracked, "generations": sizes}
        data["slow_young"] = slow_young
        data["timed"] = [[tag, read, written] for tag, (read, written) in timed.items()]
        Path(out).write_text(json.dumps(data))

    if stalls:
        gc.callbacks.append(on_gc)
        asyncio.set_event_loop_policy(Policy())
    atexit.register(dump)
    return cli.main(argv)


def attributed(trace: list[Any], timed: list[Any]) -> dict[str, float]:
    """Each measured heartbeat's latency (due to reply read) split in four, by the wall clocks of
    the generator and the tracker (one machine, one clock): the generator's send lag (due to
    sent), the tracker's queue (sent to read: in its socket while its loop served others), the
    tracker's own time (read to response written, :func:`timed_heartbeats`) and the generator's
    read lag (written to reply read). Percentiles of the tracker's own time and of sent to
    written (all the tracker's part), and the mean of each part over the slowest 1 % as the
    generator saw them: where the tail comes from."""
    server = {int(tag): (read, written) for tag, read, written in timed}
    parts = []
    for tag, due, sent, done in trace:
        if int(tag) in server:
            read, written = server[int(tag)]
            parts.append((done - due, sent - due, max(0.0, read - sent), written - read, max(0.0, done - written)))
    if not parts:
        return {"timed_fraction": 0.0}
    tail = sorted(parts, reverse=True)[: max(1, len(parts) // 100)]

    def mean_ms(k: int) -> float:
        return 1000 * sum(p[k] for p in tail) / len(tail)

    return {
        "timed_fraction": len(parts) / max(1, len(trace)),
        "srv_p50_ms": 1000 * pct([p[3] for p in parts], 0.5),
        "srv_p99_ms": 1000 * pct([p[3] for p in parts], 0.99),
        "srv_max_ms": 1000 * max(p[3] for p in parts),
        "trk_p50_ms": 1000 * pct([p[2] + p[3] for p in parts], 0.5),
        "trk_p99_ms": 1000 * pct([p[2] + p[3] for p in parts], 0.99),
        "tail_ms": mean_ms(0),
        "tail_send_lag_ms": mean_ms(1),
        "tail_queue_ms": mean_ms(2),
        "tail_server_ms": mean_ms(3),
        "tail_read_lag_ms": mean_ms(4),
    }


def stalls_in(path: Path, window: tuple[float, float]) -> dict[str, float]:
    """The tracker's loop lag and GC pauses within the window (from :func:`shim_main`'s file)."""
    data = json.loads(path.read_text())
    lags = [lag for t, lag in data["lags"] if window[0] <= t < window[1]]
    pauses = [p for t, _, p, _ in data["gc"] if window[0] <= t < window[1]]
    spent = [c for t, _, _, c in data["gc"] if window[0] <= t < window[1]]
    ordered = sorted(lags, reverse=True)
    return {
        "tracker_lag_over_10ms": sum(1 for lag in lags if lag > 0.01),
        "tracker_lag_over_100ms": sum(1 for lag in lags if lag > 0.1),
        "tracker_lag_max_ms": 1000 * (ordered[0] if ordered else 0.0),
        "tracker_lag_total_s": sum(lags),
        "tracker_gc_pauses_over_1ms": len(pauses),
        "tracker_gc_max_ms": 1000 * max(pauses, default=0.0),
        "tracker_gc_total_s": sum(pauses),
        "tracker_gc_cpu_max_ms": 1000 * max(spent, default=0.0),  # (wall minus this: waiting for a core)
    }


# -- the driver -------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid: int) -> float:
    """Seconds the threads of ``pid`` have spent runnable but waiting for a core (``schedstat``):
    how much the process was starved by others on its cores, not its own work."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_one(
    plan: Plan,
    *,
    workers: int,
    tracker_core: str,
    load_core: str,
    profile: str | None = None,
    stalls: bool = False,
    nice: int = 0,
    gc_freeze_every: float | None = None,
) -> dict[str, Any]:
    token = secrets.token_hex(16)
    port = free_port()
    env = dict(os.environ, RINGSEED_TOKEN=token, PYTHONPATH=str(ROOT))
    niced = ["nice", "-n", str(nice)] if nice else []  # (below 0: ahead of the machine's other work)
    argv = [*niced, "taskset", "-c", tracker_core, sys.executable]
    if profile is not None:  # the tracker's own profile, written when it is interrupted
        argv += ["-m", "cProfile", "-o", f"{profile}.{plan.nodes}.{plan.mode}"]
    shim = Path(f"/tmp/bench-tracker-stalls-{port}.json")
    argv += ["-m", "bench.tracker", "--shim", str(shim), *(["--shim-stalls"] if stalls else []), "--"]
    argv += ["master", "--role", "tracker"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--heartbeat-interval", str(plan.interval)]
    argv += ["--offline-after", str(max(10.0, 5 * plan.interval))]
    argv += ["--heartbeat-replies", "full" if plan.mode == "full" else "delta"]
    argv += ["--heartbeat-rate", str(plan.rate if plan.mode == "paced" else 0)]
    argv += ["--heartbeat-jitter", str(plan.jitter)]
    if gc_freeze_every is not None:  # (None: the master's default)
        argv += ["--gc-freeze-every", str(gc_freeze_every)]
    tracker = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port)
        load_before = os.getloadavg()
        register_time = max(5.0, plan.nodes / 1500)
        start = time.time() + register_time
        procs = []
        bounds = [round(plan.nodes * k / workers) for k in range(workers + 1)]
        for lo, hi in itertools.pairwise(bounds):
            cmd = [*niced, "taskset", "-c", load_core, sys.executable, "-m", "bench.tracker", "--worker"]
            cmd += ["--plan", json.dumps(asdict(plan)), "--port", str(port), "--token", token]
            cmd += ["--lo", str(lo), "--hi", str(hi), "--start", repr(start)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            if lo == 0:
                time.sleep(1.0)  # the duty node registers first
        window = (start + plan.warmup, start + plan.warmup + plan.measure)
        time.sleep(max(0.0, window[0] - time.time()))
        cpu0, wait0 = cpu_seconds(tracker.pid), runqueue_wait(tracker.pid)
        gen0 = sum(runqueue_wait(p.pid) for p in procs)
        time.sleep(max(0.0, window[1] - time.time()))
        cpu1, wait1 = cpu_seconds(tracker.pid), runqueue_wait(tracker.pid)
        starved = {"tracker": (wait1 - wait0) / plan.measure}
        starved["generator"] = (sum(runqueue_wait(p.pid) for p in procs) - gen0) / plan.measure
        rss = rss_mb(tracker.pid)
        merged = Samples()
        generator_cpu = 0.0
        for proc in procs:
            out, err = proc.communicate(timeout=plan.warmup + plan.measure + 600)
            if proc.returncode != 0 or not out.strip():
                raise RuntimeError(f"load generator failed: {err.decode()[-2000:]}")
            data = json.loads(out.decode().strip().splitlines()[-1])
            generator_cpu += data.pop("cpu_seconds")
            for key, value in data.items():
                current = getattr(merged, key)
                if key == "due_per_s":  # per second of the window: summed over workers
                    value = [a + b for a, b in itertools.zip_longest(current, value, fillvalue=0)]
                    current = []
                setattr(merged, key, current + value)
            if err.strip():
                print(err.decode()[-1000:], file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        tracker.send_signal(signal.SIGINT if profile is not None else signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            tracker.wait(timeout=10)
        if tracker.poll() is None:
            tracker.kill()
    total_time = (window[1] - start) + register_time
    row = summarise(plan, merged, cpu1 - cpu0, generator_cpu / total_time, rss, load_before, load_after)
    if shim.exists():
        record = json.loads(shim.read_text())
        row.update(attributed(merged.trace, record["timed"]))
    if stalls and shim.exists():
        row.update(stalls_in(shim, window))
    if shim.exists():
        shim.replace(Path(f"/tmp/bench-tracker-stalls-{plan.nodes}-{plan.jitter}.json"))  # (the raw record)
    row["gc_freeze_every"] = gc_freeze_every
    row["tracker_runq_wait"] = starved["tracker"]
    row["generator_runq_wait"] = starved["generator"]
    return row


def wait_healthy(port: int) -> None:
    import urllib.request

    deadline = time.time() + 30
    while time.time() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError("the tracker did not come up")


def summarise(
    plan: Plan, s: Samples, tracker_cpu: float, generator_cores: float, rss: float, before: Any, after: Any
) -> dict[str, Any]:
    n = len(s.reply_bytes) or 1
    return {
        "nodes": plan.nodes,
        "mode": plan.mode,
        "chunk_mib": plan.chunk // MiB,
        "jitter": plan.jitter,
        "wire": plan.wire,
        "peer_queries": plan.peer_queries,
        "heartbeats_per_s": len(s.heartbeat) / plan.measure,
        "hb_p50_ms": 1000 * pct(s.heartbeat, 0.5),
        "hb_p99_ms": 1000 * pct(s.heartbeat, 0.99),
        "peers_per_s": len(s.peers) / plan.measure,
        "peers_p50_ms": 1000 * pct(s.peers, 0.5),
        "peers_p99_ms": 1000 * pct(s.peers, 0.99),
        "hash_wait_p50_ms": 1000 * pct(s.watch, 0.5),
        "requests_per_s": s.requests / (plan.warmup + plan.measure),
        "tracker_cores": tracker_cpu / plan.measure,
        "tracker_us_per_request": 1e6 * tracker_cpu / max(1, s.measured),
        "generator_cores": generator_cores,
        "generator_window_cores": s.window_cpu / plan.measure,
        "gen_send_lag_p50_ms": 1000 * pct(s.send_lag, 0.5),
        "gen_send_lag_p99_ms": 1000 * pct(s.send_lag, 0.99),
        "gen_loop_lag_p99_ms": 1000 * pct(s.loop_lag, 0.99),
        "gen_loop_lag_max_ms": 1000 * max(s.loop_lag, default=float("nan")),
        "due_peak_per_s": max(s.due_per_s, default=0),
        "due_min_per_s": min(s.due_per_s, default=0),
        "reply_bytes_mean": sum(s.reply_bytes) / n,
        "reply_bytes_p50": pct([float(b) for b in s.reply_bytes], 0.5),
        "reply_bytes_p99": pct([float(b) for b in s.reply_bytes], 0.99),
        "hash_bytes_mean": sum(s.hash_bytes) / n,
        "avail_bytes_mean": sum(s.avail_bytes) / n,
        "rejected_chunks": s.rejected,
        "errors": s.errors,
        "tracker_rss_mb": rss,
        "load_before": round(before[0], 1),
        "load_after": round(after[0], 1),
    }


COLUMNS = [
    ("nodes", "N", "{:d}"),
    ("mode", "mode", "{}"),
    ("chunk_mib", "chunk MiB", "{:d}"),
    ("jitter", "jitter", "{}"),
    ("wire", "wire", "{}"),
    ("heartbeats_per_s", "hb/s", "{:.0f}"),
    ("hb_p50_ms", "hb p50 ms", "{:.1f}"),
    ("hb_p99_ms", "hb p99 ms", "{:.1f}"),
    ("srv_p50_ms", "tracker's own p50 ms", "{:.1f}"),
    ("srv_p99_ms", "tracker's own p99 ms", "{:.1f}"),
    ("trk_p99_ms", "tracker queue+own p99 ms", "{:.1f}"),
    ("tail_ms", "slowest 1%: hb ms", "{:.0f}"),
    ("tail_send_lag_ms", "of it gen send lag", "{:.0f}"),
    ("tail_queue_ms", "tracker queue", "{:.0f}"),
    ("tail_server_ms", "tracker's own", "{:.0f}"),
    ("tail_read_lag_ms", "gen read lag", "{:.0f}"),
    ("peers_per_s", "peers/s", "{:.0f}"),
    ("peers_p99_ms", "peers p99 ms", "{:.1f}"),
    ("tracker_cores", "tracker cores", "{:.2f}"),
    ("tracker_us_per_request", "CPU us/request", "{:.0f}"),
    ("tracker_runq_wait", "tracker runq wait", "{:.2f}"),
    ("tracker_lag_max_ms", "tracker loop lag max ms", "{:.0f}"),
    ("tracker_lag_over_100ms", "tracker stalls > 100 ms", "{:d}"),
    ("tracker_gc_max_ms", "tracker GC max ms", "{:.0f}"),
    ("tracker_gc_cpu_max_ms", "of which CPU ms", "{:.0f}"),
    ("generator_window_cores", "generator cores", "{:.2f}"),
    ("generator_runq_wait", "generator runq wait", "{:.2f}"),
    ("gen_send_lag_p99_ms", "gen send lag p99 ms", "{:.1f}"),
    ("gen_loop_lag_p99_ms", "gen loop lag p99 ms", "{:.1f}"),
    ("due_peak_per_s", "hb due peak/s", "{:d}"),
    ("due_min_per_s", "hb due min/s", "{:d}"),
    ("reply_bytes_mean", "reply B mean", "{:.0f}"),
    ("reply_bytes_p50", "reply B p50", "{:.0f}"),
    ("reply_bytes_p99", "reply B p99", "{:.0f}"),
    ("hash_bytes_mean", "hashes B", "{:.0f}"),
    ("avail_bytes_mean", "avail B", "{:.0f}"),
    ("tracker_rss_mb", "RSS MB", "{:.0f}"),
    ("rejected_chunks", "rejected", "{:d}"),
    ("errors", "errors", "{:d}"),
    ("load_before", "load", "{}"),
]


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key, float("nan"))
            cells.append(fmt.format(value) if not (isinstance(value, float) and math.isnan(value)) else "-")
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,10000", help="emulated agents per run, comma-separated")
    parser.add_argument(
        "--modes",
        default="delta,paced",
        help="full (before issue 11), delta (change replies, every agent at --interval) and/or paced "
        "(agents at the pace the tracker names, with early heartbeats)",
    )
    parser.add_argument("--rate", type=int, default=1000, help="paced: the tracker's --heartbeat-rate")
    parser.add_argument(
        "--jitter",
        default="0.5",
        help="paced: the tracker's --heartbeat-jitter, comma-separated for rows side by side (0: the "
        "pace before session 5, agents keep the phases they started with)",
    )
    parser.add_argument(
        "--wire",
        default="runs",
        help="how agents announce chunks, comma-separated for rows side by side: items (one [index, hash, "
        "from] per chunk, as before session 6) or runs ([first, count] runs and 16 sources per heartbeat, "
        "and index_runs: the view's chunk lists as runs)",
    )
    parser.add_argument("--chunk-mib", type=int, default=CHUNK // MiB, help="chunk size of the 500 GB model (MiB)")
    parser.add_argument("--interval", type=float, default=2.0, help="heartbeat interval (the master's default)")
    parser.add_argument("--peer-queries", action="store_true", help="one GET /v1/peers per chunk an agent gets")
    parser.add_argument("--streams", type=int, default=8, help="agents waiting for each pulled chunk's hash")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--measure", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="load generator processes (all on --load-core)")
    parser.add_argument("--tracker-core", default="0")
    parser.add_argument("--load-core", default="1")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--profile", help="write the tracker's cProfile stats to PROFILE.<nodes>.<mode>")
    parser.add_argument(
        "--stalls",
        action="store_true",
        help="record the tracker's own event-loop lag (a 10 ms timer in its loop) and GC pauses in the window",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the tracker and the generator at this niceness (e.g. -10, as root: on a shared machine, "
        "the tracker's latencies are then its own, not the neighbours' CPU use; see 'runq wait')",
    )
    parser.add_argument(
        "--gc-freeze-every",
        type=float,
        default=None,
        help="the tracker's --gc-freeze-every (its collector policy since session 6; default: the master's, "
        "0.25 s; 0: Python's own)",
    )
    parser.add_argument("--shim", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--lo", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hi", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    if "--shim" in sys.argv[1:3]:  # the tracker itself, with its own timing (and stalls) recorded
        at = sys.argv.index("--")
        raise SystemExit(shim_main(sys.argv[2], sys.argv[at + 1 :], stalls="--shim-stalls" in sys.argv[3:at]))
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    rows = []
    runs = [
        (n, m, j, w)
        for n in args.nodes.split(",")
        for m in args.modes.split(",")
        for j in args.jitter.split(",")
        for w in args.wire.split(",")
    ]
    for nodes_text, mode, jitter, wire in runs:
        nodes = int(nodes_text)
        plan = Plan(
            nodes=nodes,
            mode=mode,
            interval=args.interval,
            peer_queries=args.peer_queries,
            streams=args.streams,
            warmup=args.warmup,
            measure=args.measure,
            rate=args.rate,
            jitter=float(jitter),
            chunk=args.chunk_mib * MiB,
            wire=wire,
        )
        print(
            f"# N={nodes} mode={mode} jitter={jitter} wire={wire} peer_queries={args.peer_queries} ...",
            file=sys.stderr,
            flush=True,
        )
        rows.append(
            run_one(
                plan,
                workers=args.workers,
                tracker_core=args.tracker_core,
                load_core=args.load_core,
                profile=args.profile,
                stalls=args.stalls,
                nice=args.nice,
                gc_freeze_every=args.gc_freeze_every,
            )
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    by = {(r["nodes"], r["mode"]): r for r in rows if r["jitter"] == float(args.jitter.split(",")[-1])}
    for nodes in sorted({r["nodes"] for r in rows}):
        full, delta = by.get((nodes, "full")), by.get((nodes, "delta"))
        if full and delta:
            print(
                f"N={nodes}: reply bytes delta/full = {delta['reply_bytes_mean'] / full['reply_bytes_mean']:.3f}, "
                f"tracker CPU delta/full = {delta['tracker_cores'] / max(full['tracker_cores'], 1e-9):.3f}"
            )


if __name__ == "__main__":
    main()
