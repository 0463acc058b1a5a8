"""The agent's data path in bytes per CPU-second, beside the machine's limits and libtorrent, one run.

    .venv/bin/python -m bench.datapath [--size 1Gi] [--receivers 1,2,4] [--holders 1,2,4] \\
        [--chunk-size 64Mi] [--methods ringseed,libtorrent] [--torrent v1] [--json OUT]

Everything runs on loopback with every file in RAM (a directory under /dev/shm), unshaped: what
is measured is the CPU the processes spend per byte they move, the cost that decides whether one
agent can fill a 10-400 Gbit/s NIC. CPU is read from /proc/<pid>/stat (user and system, all
threads) before and after each transfer, so process start-up is not counted.

- limits: one thread each, CPU from ``time.thread_time``: SHA-256 (hashlib), memcpy, a plain TCP
  socket pair on loopback (``sendall`` of one preallocated buffer, ``os.sendfile`` from a file in
  RAM, ``recv_into`` one preallocated buffer), the ideal receiver (``recv_into`` a chunk
  buffer, SHA-256 it, ``pwrite`` it into a file in RAM) and the ideal receiver in place
  (``fallocate`` the chunk's region of a file, map it, ``recv_into`` the mapping, SHA-256 it),
  the ideal direct receiver (``recv_into`` one reused chunk buffer, SHA-256 it, ``pwrite`` it with
  ``O_DIRECT``: no page cache) and what memory never touched before costs on its first write (over a
  rewrite: faults and zeroing; on a virtual machine whose free pages went back to the host, more).
- origin: one agent on origin duty pulls the model from a ``file://`` origin in RAM (reads,
  hashes, stores). Gate: the agent is up and idle before the master starts. Its memory tier
  holds the whole model, so it then serves it from memory to one receiver (``1 to 1, memory``).
  Then another agent pulls it from an HTTP origin on loopback (``bench/baselines/http_origin.py``,
  ranged GETs), the server's CPU not counted.
- serve K: one holder (an agent restarted over a complete staging directory, so it serves from
  its staged files) and K receivers that start empty. The holder only sends; receivers receive
  and relay to each other (their bytes are in + out).
- pull H: H holders and one receiver; the receiver only receives, the holders only send.
  Gate for both: the holders are stopped (SIGSTOP) while the receivers start, register and ask
  them for chunks; once the receivers are idle, CPU is sampled and the holders go on (SIGCONT).
  The run ends when every receiver reported a verified, materialised copy; each copy is then
  hashed against the source's manifest by this script.
- libtorrent, the same shapes (``bench/baselines/torrent.py``: one seed and K peers, H seeds and
  one peer; peers save into RAM too). Gate: every process loaded its torrent (seeds: checked).

Columns: bytes a role moved, its CPU (user + system), GB per CPU-second, ns of CPU per byte,
the copies delivered per wall second, the chunk requests the role refused busy (429) and the chunk
buffers its agents mapped fresh (``maps``: 64 MiB each whose first touch costs, see the limits). The CPU
includes what an agent spends whether or not it moves bytes (heartbeats, its loops; measured once
per run on the idle origin puller and printed): on a loaded machine, where a transfer takes many
seconds, that share of the ns per byte is larger than at NIC speed.

``--profile perf|py-spy|strace`` runs only ringseed's one-to-one transfers with the tool attached
(see BENCHMARKS.md for reading the files).
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import hashlib
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import testbed_common as common
from ringseed.agent import origins
from ringseed.local import swarm
from ringseed.protocol import manifest, units

GB = 1e9
IDLE_WINDOW_S = 5.0
HEARTBEAT_S = 2.0  # the master's default heartbeat interval (agents heartbeat sooner when they have news)


# -- the machine's limits -------------------------------------------------------------------------


def _timed(work: Callable[[], int]) -> tuple[int, float]:
    """(bytes, CPU seconds of this thread) for ``work()``."""
    started = time.thread_time()
    done = work()
    return done, time.thread_time() - started


def sha256_rate(buf: memoryview, *, total: int) -> float:
    def work() -> int:
        hasher = hashlib.sha256()
        for _ in range(total // len(buf)):
            hasher.update(buf)
        return total // len(buf) * len(buf)

    done, cpu = _timed(work)
    return done / cpu


def memcpy_rate(buf: memoryview, *, total: int) -> float:
    target = memoryview(bytearray(len(buf)))
    target[:] = buf  # fault its pages in first: the copies are what is timed

    def work() -> int:
        for _ in range(total // len(buf)):
            target[:] = buf
        return total // len(buf) * len(buf)

    done, cpu = _timed(work)
    return done / cpu


def _socket_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def tcp_rates(*, send: Callable[[socket.socket], int], receive: Callable[[socket.socket], int]) -> dict[str, float]:
    """Run ``send`` and ``receive`` on the two ends of one loopback TCP connection, each in its own
    thread; bytes per CPU-second of each side and bytes per wall second."""
    sender, receiver = _socket_pair()
    results: dict[str, tuple[int, float]] = {}

    def side(name: str, job: Callable[[socket.socket], int], sock: socket.socket) -> None:
        with sock:
            results[name] = _timed(lambda: job(sock))

    threads = [
        threading.Thread(target=side, args=("send", send, sender)),
        threading.Thread(target=side, args=("recv", receive, receiver)),
    ]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    (sent, send_cpu), (got, recv_cpu) = results["send"], results["recv"]
    return {"send": sent / send_cpu, "recv": got / recv_cpu, "wall": got / wall}


def _sendall(buf: memoryview, total: int) -> Callable[[socket.socket], int]:
    def job(sock: socket.socket) -> int:
        for _ in range(total // len(buf)):
            sock.sendall(buf)
        sock.shutdown(socket.SHUT_WR)
        return total // len(buf) * len(buf)

    return job


def _sendfile(path: Path, total: int) -> Callable[[socket.socket], int]:
    def job(sock: socket.socket) -> int:
        size = path.stat().st_size
        sent = 0
        with open(path, "rb") as f:
            while sent < total:
                offset = sent % size
                sent += os.sendfile(sock.fileno(), f.fileno(), offset, min(size - offset, total - sent))
        sock.shutdown(socket.SHUT_WR)
        return sent

    return job


def _fill(sock: socket.socket, view: memoryview) -> int:
    """``recv_into`` until ``view`` is full or the peer closed; the bytes received."""
    filled = 0
    while filled < len(view):
        n = sock.recv_into(view[filled:])
        if n == 0:
            break
        filled += n
    return filled


def _recv_into(chunk: int, *, then: Callable[[memoryview, int], None] | None = None) -> Callable[[socket.socket], int]:
    def job(sock: socket.socket) -> int:
        buf = memoryview(bytearray(chunk))
        total = 0
        while True:
            filled = _fill(sock, buf)
            if then is not None and filled:
                then(buf[:filled], total)
            total += filled
            if filled < chunk:
                return total

    return job


def machine_limits(*, work: Path, chunk: int, total: int) -> dict[str, float]:
    """Bytes per CPU-second of the primitives a data path is made of, measured now."""
    buf = memoryview(os.urandom(1 << 20) * (chunk >> 20))
    file = work / "limits.bin"
    file.write_bytes(buf)
    out = {"sha256": sha256_rate(buf, total=total), "memcpy": memcpy_rate(buf, total=total)}
    plain = tcp_rates(send=_sendall(buf, total), receive=_recv_into(chunk))
    out.update({"tcp_send": plain["send"], "tcp_recv": plain["recv"], "tcp_wall": plain["wall"]})
    out["sendfile_send"] = tcp_rates(send=_sendfile(file, total), receive=_recv_into(chunk))["send"]
    staged = os.open(work / "ideal-staging.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:

        def verify_and_store(view: memoryview, offset: int) -> None:
            hashlib.sha256(view).digest()
            os.pwrite(staged, view, offset)  # fresh pages, as staging a model is

        ideal = tcp_rates(send=_sendall(buf, total), receive=_recv_into(chunk, then=verify_and_store))
    finally:
        os.close(staged)
    out["ideal_receiver"] = ideal["recv"]
    file.unlink()
    (work / "ideal-staging.bin").unlink()
    in_place = tcp_rates(send=_sendall(buf, total), receive=_recv_in_place(work / "ideal-in-place.bin", chunk, total))
    out["in_place_receiver"] = in_place["recv"]
    (work / "ideal-in-place.bin").unlink()
    direct = _recv_direct(work / "ideal-direct.bin", chunk)
    if direct is not None:
        out["direct_receiver"] = tcp_rates(send=_sendall(buf, total), receive=direct)["recv"]
        (work / "ideal-direct.bin").unlink()
    out["first_touch"] = first_touch_rate(buf, total=total)
    return out


def first_touch_rate(buf: memoryview, *, total: int) -> float:
    """Bytes per CPU-second of the extra cost of writing into memory never touched before (a fresh
    anonymous map) over writing into the same memory again: the kernel's fault and zeroing, and on a
    virtual machine whose free pages went back to the host, the host's."""
    area = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = memoryview(area)

    def fill() -> int:
        for offset in range(0, total - len(buf) + 1, len(buf)):
            view[offset : offset + len(buf)] = buf
        return total // len(buf) * len(buf)

    try:
        done, first = _timed(fill)
        _, again = _timed(fill)
    finally:
        view.release()
        area.close()
    return done / max(1e-9, first - again)


def _recv_direct(path: Path, chunk: int) -> Callable[[socket.socket], int] | None:
    """The ideal receiver writing with O_DIRECT: ``recv_into`` one reused (warm) chunk buffer, SHA-256
    it, ``pwrite`` it with O_DIRECT (no page cache); None where the file system refuses O_DIRECT."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except (OSError, AttributeError):
        path.unlink(missing_ok=True)
        return None

    def job(sock: socket.socket) -> int:
        area = mmap.mmap(-1, chunk, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned
        view = memoryview(area)
        view[:] = bytes(chunk)  # warm: a receiver reuses its buffers
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        total = 0
        try:
            while True:
                filled = _fill(sock, view)
                if filled:
                    hashlib.sha256(view[:filled]).digest()
                    aligned = filled - filled % 4096
                    if aligned:
                        os.pwrite(fd, view[:aligned], total)
                    if aligned < filled:
                        with open(path, "r+b") as f:
                            f.seek(total + aligned)
                            f.write(view[aligned:filled])
                total += filled
                if filled < chunk:
                    return total
        finally:
            os.close(fd)
            view.release()
            area.close()

    return job


def _recv_in_place(path: Path, chunk: int, total: int) -> Callable[[socket.socket], int]:
    """The ideal receiver in place: each chunk's region of a sized file allocated (``fallocate``),
    mapped, received into with ``recv_into`` and hashed: what an agent receiving into staging does."""

    def job(sock: socket.socket) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, total)
            done = 0
            while done < total:
                length = min(chunk, total - done)
                os.posix_fallocate(fd, done, length)
                area = mmap.mmap(fd, length, offset=done)
                view = memoryview(area)
                filled = _fill(sock, view)
                hashlib.sha256(view[:filled]).digest()
                view.release()
                area.close()
                done += filled
                if filled < length:
                    break
            return done
        finally:
            os.close(fd)

    return job


# -- processes ------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One measured process: its role, CPU at the gate and at the end, bytes it moved."""

    name: str
    role: str  # "sender" or "receiver"
    popen: subprocess.Popen[Any]
    port: int = 0
    cpu_before: tuple[float, float] = (0.0, 0.0)
    cpu_after: tuple[float, float] = (0.0, 0.0)
    sent: int = 0
    received: int = 0
    refused: int = 0  # chunk requests it answered busy (429)
    mapped: int = 0  # chunk buffers it mapped fresh so far (an agent's; each page's first touch costs)

    def sample(self) -> tuple[float, float]:
        return common.cpu_times(self.popen.pid)

    @property
    def user(self) -> float:
        return self.cpu_after[0] - self.cpu_before[0]

    @property
    def system(self) -> float:
        return self.cpu_after[1] - self.cpu_before[1]


def wait_idle(procs: list[Proc], *, timeout: float = 60.0, quiet: float = 0.02) -> None:
    """Wait until each of ``procs`` used at most ``quiet`` CPU-seconds over 0.5 s (start-up done)."""
    quiet *= len(procs)
    deadline = time.monotonic() + timeout
    last = sum(sum(p.sample()) for p in procs)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(sum(p.sample()) for p in procs)
        if now - last <= quiet:
            return
        last = now
    raise TimeoutError(f"processes still busy after {timeout:.0f}s: {[p.name for p in procs]}")


def idle_rate(proc: Proc, *, window: float = IDLE_WINDOW_S) -> float:
    """CPU-seconds per second ``proc`` uses while it moves no byte (heartbeats, the agent's loops)."""
    wait_idle([proc])
    before, started = sum(proc.sample()), time.monotonic()
    time.sleep(window)
    return (sum(proc.sample()) - before) / (time.monotonic() - started)


class Swarm(swarm.LocalSwarm):
    """A loopback master and agents measured as :class:`Proc` (the background scrub off: it re-hashes
    staged chunks at 16 MiB/s once a model is published, which is not the data path)."""

    staging_writes: str | None = None  # ``ringseed agent --staging-writes`` (None: the agent's default)

    def __init__(self, *, workdir: Path, source: str, chunk: int, memory: int) -> None:
        super().__init__(
            source=source,
            nodes=0,
            workdir=workdir,
            chunk_size=chunk,
            memory_bytes=memory,
            heartbeat_interval=HEARTBEAT_S,
            offline_after=120.0,
        )

    def start_node(self, name: str, *, role: str, memory: int | None = None) -> Proc:
        self.agent_args = ["--scrub-rate", "0", *(["--memory-bytes", str(memory)] if memory else [])]
        if self.staging_writes is not None:
            self.agent_args += ["--staging-writes", self.staging_writes]
        self.start_agent(name)
        self.names.append(name)
        return Proc(name=name, role=role, popen=self.procs[name], port=self.agent_ports[name])

    def staging(self, name: str) -> Path:
        return self.journal(name).parent

    def moved(self, proc: Proc) -> tuple[int, int, int]:
        """(bytes sent to peers, bytes received, requests refused busy) so far, from /metrics; also
        notes the chunk buffers it mapped fresh (``proc.mapped``)."""
        counters = self.agent_metrics(proc.name, timeout=30) or {}
        keys = ("ringseed_agent_bytes_uploaded", "ringseed_agent_bytes_fetched", "ringseed_agent_uploads_refused")
        sent, received, refused = (int(counters.get(key, 0)) for key in keys)
        proc.mapped = int(counters.get("ringseed_agent_chunk_buffers_mapped", 0))
        return sent, received, refused


def link_staging(source: Path, target: Path) -> None:
    """A holder's staging directory: the staged model files hard-linked (no second copy in RAM),
    the journal and layout copied."""
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name, copy_function=os.link)
        else:
            shutil.copy2(entry, target / entry.name)


def _check_copies(names: list[str], paths: Callable[[str], Path], expected: manifest.Manifest) -> None:
    """Every agent's materialised copy carries the source's digest and hashes to its manifest."""
    for name in names:
        found = swarm.verify_copy(paths(name), expected)
        if found != {"complete": True, "verified": True}:
            raise RuntimeError(f"{name}: the copy at {paths(name)} does not match the source ({found})")


def _check_same(copy: Path, source: Path) -> None:
    """Every file of ``source`` is in ``copy`` with the same bytes (libtorrent's copies)."""
    for path in source.rglob("*"):
        if path.is_file() and not filecmp.cmp(path, copy / path.relative_to(source), shallow=False):
            raise RuntimeError(f"{copy / path.relative_to(source)} differs from the source")


# -- ringseed scenarios ---------------------------------------------------------------------------


def ringseed_origin(
    *, work: Path, source: Path, chunk: int, memory: int, expected: manifest.Manifest, profile: str | None = None
) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """One agent pulls the model from a file:// origin into a memory tier that holds all of it, then
    serves it from memory to one receiver. Returns both results and the puller's staging directory."""
    size = expected.layout.total_size
    with Swarm(workdir=work, source=source.as_uri(), chunk=chunk, memory=memory) as local:
        puller = local.start_node("origin-puller", role="receiver", memory=max(memory, size + chunk))
        wait_idle([puller])  # retrying registration against a master that is not there yet
        puller.cpu_before = puller.sample()
        started = time.monotonic()
        local.start_master()
        local.wait_for(local.all_verified, timeout=600, what="the origin pull")
        seconds = time.monotonic() - started
        puller.cpu_after = puller.sample()
        puller.received = int((local.agent_metrics(puller.name) or {}).get("ringseed_agent_bytes_from_origin", 0))
        local.moved(puller)  # notes its buffers
        pulled = {"seconds": seconds, "procs": [puller], "idle_cpu_per_s": idle_rate(puller)}
        holder = Proc(name=puller.name, role="sender", popen=puller.popen, port=puller.port)
        served = _transfer(local, [holder], receivers=1, profile=profile)
    _check_copies(["origin-puller", "receiver-0"], local.model_dir, expected)
    return pulled, served, local.staging("origin-puller")


def ringseed_http_origin(
    *, work: Path, source: Path, chunk: int, memory: int, expected: manifest.Manifest
) -> dict[str, Any]:
    """One agent pulls the model from an HTTP origin on loopback (ranged GETs; aiohttp's FileResponse
    serves them with sendfile); only the agent's CPU is counted."""
    port = swarm.free_port()
    argv = [common.PY, "-m", "bench.baselines.http_origin", str(source), "--host", "127.0.0.1", "--port", str(port)]
    server = common.spawn(None, argv, log=work / "logs" / "http-origin.log")
    try:
        common.read_line(server, timeout=60, what="the HTTP origin")
        with Swarm(workdir=work, source=f"http://127.0.0.1:{port}/", chunk=chunk, memory=memory) as local:
            puller = local.start_node("origin-puller", role="receiver")
            wait_idle([puller])
            puller.cpu_before = puller.sample()
            started = time.monotonic()
            local.start_master()
            local.wait_for(local.all_verified, timeout=600, what="the HTTP origin pull")
            seconds = time.monotonic() - started
            puller.cpu_after = puller.sample()
            puller.received = int((local.agent_metrics(puller.name) or {}).get("ringseed_agent_bytes_from_origin", 0))
            local.moved(puller)  # notes its buffers
        _check_copies(["origin-puller"], local.model_dir, expected)
    finally:
        server.kill()
        server.wait()
    return {"seconds": seconds, "procs": [puller]}


def ringseed_swarm(
    *,
    work: Path,
    staged: Path,
    holders: int,
    receivers: int,
    chunk: int,
    memory: int,
    source: str,
    expected: manifest.Manifest,
    profile: str | None = None,
) -> dict[str, Any]:
    """``holders`` agents restarted over a complete staging directory serve ``receivers`` empty ones."""
    with Swarm(workdir=work, source=source, chunk=chunk, memory=memory) as local:
        local.start_master()
        senders = []
        for index in range(holders):
            name = f"holder-{index}"
            link_staging(staged, local.staging(name))
            senders.append(local.start_node(name, role="sender"))
        local.wait_for(local.all_verified, timeout=120, what="the holders to register")
        result = _transfer(local, senders, receivers=receivers, profile=profile)
    _check_copies([p.name for p in result["procs"] if p.role == "receiver"], local.model_dir, expected)
    return result


def _transfer(local: Swarm, senders: list[Proc], *, receivers: int, profile: str | None) -> dict[str, Any]:
    """Receivers start (the senders stopped meanwhile), the gate opens, every receiver gets a verified copy."""
    wait_idle(senders)
    before = {p.name: local.moved(p) for p in senders}  # a holder that pulled from the origin counted that
    takers, profilers = _start_receivers(local, senders, receivers=receivers, profile=profile)
    everyone = senders + takers
    started = time.monotonic()
    local.wait_for(local.all_verified, timeout=900, what="every receiver verified")
    seconds = time.monotonic() - started
    for proc in everyone:
        proc.cpu_after = proc.sample()
    stop_profilers(profilers)
    for proc in everyone:
        now, then = local.moved(proc), before.get(proc.name, (0, 0, 0))
        proc.sent, proc.received, proc.refused = (a - b for a, b in zip(now, then, strict=True))
    return {"seconds": seconds, "procs": everyone}


def _start_receivers(
    local: Swarm, senders: list[Proc], *, receivers: int, profile: str | None
) -> tuple[list[Proc], list[subprocess.Popen[Any]]]:
    """Start the receivers while the holders are stopped; sample everyone's CPU, then let the
    holders go on. Returns the receivers and the profilers attached (if ``profile``)."""
    for proc in senders:
        os.kill(proc.popen.pid, signal.SIGSTOP)
    try:
        takers = [local.start_node(f"receiver-{i}", role="receiver") for i in range(receivers)]
        local.wait_for(lambda s: all(n in s.get("nodes", {}) for n in local.names), timeout=120, what="receivers")
        wait_idle(takers)
        out = local.workdir.parent / "profile" / local.workdir.name
        profilers = start_profilers(profile, senders + takers, out=out) if profile else []
        for proc in senders + takers:
            proc.cpu_before = proc.sample()
    finally:
        for proc in senders:
            os.kill(proc.popen.pid, signal.SIGCONT)
    return takers, profilers


def start_profilers(tool: str, procs: list[Proc], *, out: Path) -> list[subprocess.Popen[Any]]:
    """Attach ``tool`` to every process; the files land in ``out``. perf records the whole machine
    (threads started later are in it too): ``perf report -i out/perf.data --pid PID`` (``pids.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "pids.json").write_text(json.dumps({p.name: p.popen.pid for p in procs}))
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    commands = {
        "py-spy": lambda p: [py_spy, "record", "--pid", str(p.popen.pid), "--rate", "200", "--threads",
                             "--format", "raw", "--output", str(out / f"{p.name}.py-spy.txt")],
        "strace": lambda p: ["strace", "-c", "-f", "-p", str(p.popen.pid), "-o", str(out / f"{p.name}.strace.txt")],
    }  # fmt: skip
    if tool == "perf":
        argvs = [["perf", "record", "-a", "-g", "-F", "999", "-o", str(out / "perf.data")]]
    else:
        argvs = [commands[tool](p) for p in procs]
    children = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for a in argvs]
    time.sleep(1.0)  # attached before the holders go on
    return children


def stop_profilers(children: list[subprocess.Popen[Any]]) -> None:
    for child in children:
        child.send_signal(signal.SIGINT)
    for child in children:
        child.wait(timeout=120)


# -- libtorrent scenarios -------------------------------------------------------------------------


def torrent_swarm(
    *, work: Path, torrent: Path, content_parent: Path, seeds: int, peers: int, timeout: float
) -> dict[str, Any]:
    ports = [swarm.free_port() for _ in range(seeds + peers)]
    gate, stop = work / "gate", work / "stop"
    procs: list[Proc] = []
    for index, port in enumerate(ports):
        role = "sender" if index < seeds else "receiver"
        name = f"seed-{index}" if role == "sender" else f"peer-{index - seeds}"
        others = ",".join(f"127.0.0.1:{p}" for p in ports if p != port)
        save = content_parent if role == "sender" else work / name
        argv = [common.PY, "-m", "bench.baselines.torrent", "seed" if role == "sender" else "peer", str(torrent)]
        argv += [str(save), "--listen", f"127.0.0.1:{port}", "--connect", others, "--node", name]
        argv += ["--gate", str(gate), "--stop", str(stop)]
        popen = common.spawn(None, argv, log=work / "logs" / f"{name}.log")
        procs.append(Proc(name=name, role=role, popen=popen, port=port))
    try:
        for proc in procs:
            common.read_line(proc.popen, timeout=300, what=f"libtorrent {proc.name} READY")
        wait_idle(procs)
        for proc in procs:
            proc.cpu_before = proc.sample()
        started = common.gate(gate)
        ends = [json.loads(common.read_line(p.popen, timeout=timeout, what=p.name))["end"] for p in procs[seeds:]]
        seconds = max(ends) - started
        for proc in procs:
            proc.cpu_after = proc.sample()
        common.gate(stop)
        for proc in procs:
            totals = json.loads(common.read_line(proc.popen, timeout=60, what=f"{proc.name} totals"))
            proc.sent, proc.received = int(totals["uploaded"]), int(totals["downloaded"])
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait()
    return {"seconds": seconds, "procs": procs}


# -- tables ---------------------------------------------------------------------------------------


def role_totals(procs: list[Proc], role: str, *, idle_cpu: float = 0.0) -> dict[str, float]:
    """Bytes and CPU of the processes in ``role``; ``idle_cpu``: the CPU-seconds they would have
    used moving nothing over the same time (left out of ``ns_per_byte_less_idle``)."""
    chosen = [p for p in procs if p.role == role]
    moved = sum(p.sent + p.received for p in chosen)
    user, system = sum(p.user for p in chosen), sum(p.system for p in chosen)
    cpu = user + system
    net = max(0.0, cpu - len(chosen) * idle_cpu)
    return {
        "bytes": moved,
        "sent": sum(p.sent for p in chosen),
        "received": sum(p.received for p in chosen),
        "user": user,
        "system": system,
        "refused": sum(p.refused for p in chosen),
        "buffers_mapped": sum(p.mapped for p in chosen),
        "gb_per_cpu_s": moved / cpu / GB if cpu > 0 else float("inf"),
        "ns_per_byte": cpu / moved * 1e9 if moved else float("nan"),
        "ns_per_byte_less_idle": net / moved * 1e9 if moved else float("nan"),
    }


HEADER = (
    f"{'scenario':<14} {'method':<13} {'role':<9} {'GB moved':>9} {'user s':>7} {'sys s':>7} "
    f"{'GB/CPU-s':>9} {'ns/B':>6} {'-idle':>6} {'wall GB/s':>9} {'429s':>5} {'maps':>5}"
)


def print_rows(
    scenario: str, method: str, result: dict[str, Any], *, size: int, idle: float | None = None
) -> list[dict[str, Any]]:
    """Print and return one row per role; ``idle``: an idle agent's CPU-seconds per second, for
    the ``-idle`` column (ns/B less what each process would have used moving nothing)."""
    rows = []
    for role in ("sender", "receiver"):
        totals = role_totals(result["procs"], role, idle_cpu=(idle or 0.0) * result["seconds"])
        if not totals["bytes"]:
            continue
        wall = (size * result.get("copies", 1)) / result["seconds"] / GB
        row = {"scenario": scenario, "method": method, "role": role, "seconds": result["seconds"], **totals}
        rows.append(row)
        print(
            f"{scenario:<14} {method:<13} {role:<9} {totals['bytes'] / GB:>9.2f} {totals['user']:>7.2f} "
            f"{totals['system']:>7.2f} {totals['gb_per_cpu_s']:>9.2f} {totals['ns_per_byte']:>6.2f} "
            f"{format(totals['ns_per_byte_less_idle'], '6.2f') if idle is not None else '-':>6} {wall:>9.2f} "
            f"{totals['refused'] if method == 'ringseed' else '-':>5} "
            f"{totals['buffers_mapped'] if method == 'ringseed' else '-':>5}",
            flush=True,
        )
    return rows


def print_limits(limits: dict[str, float]) -> None:
    names = {
        "sha256": "SHA-256 (hashlib), one core",
        "memcpy": "memcpy (bytearray slice), one core",
        "tcp_send": "TCP loopback send (sendall)",
        "sendfile_send": "TCP loopback send (sendfile from RAM)",
        "tcp_recv": "TCP loopback receive (recv_into)",
        "tcp_wall": "TCP loopback, one connection (wall GB/s)",
        "ideal_receiver": "ideal receiver: recv_into + SHA-256 + pwrite",
        "in_place_receiver": "ideal in place: fallocate+mmap+recv_into+SHA-256",
        "direct_receiver": "ideal direct: recv_into+SHA-256+O_DIRECT pwrite",
        "first_touch": "fresh memory: first write's extra over a rewrite",
    }
    for key, label in names.items():
        if key not in limits:
            continue
        value = limits[key] / GB
        unit = "GB/s" if key == "tcp_wall" else "GB/CPU-s"
        print(f"  {label:<48} {value:>6.2f} {unit}   {1 / value:>5.2f} ns/B")


# -- main -----------------------------------------------------------------------------------------


def _model_manifest(root: Path, chunk: int) -> manifest.Manifest:
    async def build() -> manifest.Manifest:
        origin = origins.open_origin(root.as_uri())
        try:
            return await origins.build_manifest(origin, chunk_size=chunk)
        finally:
            await origin.close()

    return asyncio.run(build())


def run_all(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    size, chunk, memory = args.size, args.chunk, args.memory
    rows: list[dict[str, Any]] = []
    print(f"S = {size / 2**30:g} GiB, chunk {chunk >> 20} MiB, memory tier {memory >> 20} MiB, in {work}, "
          f"staging writes {Swarm.staging_writes or 'auto'}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    if not args.profile:
        limits = machine_limits(work=work, chunk=chunk, total=max(size, 4 * chunk))
        print("machine limits (this run):")
        print_limits(limits)
        rows.append({"scenario": "limits", **limits})
    source = common.write_model(work / "source", size=size)
    expected = _model_manifest(source, chunk)
    print(HEADER)
    methods = args.methods.split(",")
    staged = None
    idle: float | None = None
    if "ringseed" in methods:
        pulled, served, staged = ringseed_origin(
            work=work / "origin", source=source, chunk=chunk, memory=memory, expected=expected, profile=args.profile
        )
        idle = pulled["idle_cpu_per_s"]
        rows += print_rows("origin file://", "ringseed", pulled, size=size, idle=idle)
        rows.append({"scenario": "idle agent", "cpu_per_s": idle})
        print(f"  (an idle agent, complete and heartbeating, uses {idle * 1e3:.1f} ms of CPU per second)", flush=True)
        rows += print_rows("1 to 1, memory", "ringseed", served, size=size, idle=idle)
        if not args.profile:
            over_http = ringseed_http_origin(
                work=work / "origin-http", source=source, chunk=chunk, memory=memory, expected=expected
            )
            rows += print_rows("origin http://", "ringseed", over_http, size=size, idle=idle)
            shutil.rmtree(work / "origin-http", ignore_errors=True)
    shapes = [(1, k) for k in args.receivers] + [(h, 1) for h in args.holders if h != 1 or 1 not in args.receivers]
    torrent = None
    if "libtorrent" in methods:
        torrent = work / "model.torrent"
        subprocess.run([common.PY, "-m", "bench.baselines.torrent", "make", str(source), str(torrent),
                        "--version", args.torrent], cwd=common.REPO, check=True)  # fmt: skip
    for holders, receivers in shapes:
        scenario = f"serve {receivers}" if holders == 1 else f"pull {holders}"
        if holders == 1 and receivers == 1:
            scenario = "1 to 1"
        if staged is not None:
            result = ringseed_swarm(work=work / f"rs-{holders}-{receivers}", staged=staged, holders=holders,
                                    receivers=receivers, chunk=chunk, memory=memory, source=source.as_uri(),
                                    expected=expected, profile=args.profile)  # fmt: skip
            result["copies"] = receivers
            rows += print_rows(scenario, "ringseed", result, size=size, idle=idle)
            shutil.rmtree(work / f"rs-{holders}-{receivers}", ignore_errors=True)
        if torrent is not None:
            lt_work = work / f"lt-{holders}-{receivers}"
            result = torrent_swarm(work=lt_work, torrent=torrent, content_parent=source.parent, seeds=holders,
                                   peers=receivers, timeout=args.timeout)  # fmt: skip
            for proc in result["procs"][holders:]:
                _check_same(lt_work / proc.name / source.name, source)
            result["copies"] = receivers
            rows += print_rows(scenario, f"libtorrent/{args.torrent}", result, size=size)
            shutil.rmtree(lt_work, ignore_errors=True)
    print_summary(rows)
    return rows


TARGET_NS = {"receiver": 1.0, "sender": 0.25}  # issue 16: >= 1 and >= 4 GB per CPU-second


def print_summary(rows: list[dict[str, Any]]) -> None:
    """Per role: ringseed's range of ns/B against the target (and the ideal receiver), and
    libtorrent's ns/B over ringseed's in each shape both ran."""
    moved = [r for r in rows if "role" in r]
    limits = next((r for r in rows if r.get("scenario") == "limits"), None)
    for role, target in TARGET_NS.items():
        ours = [r for r in moved if r["method"] == "ringseed" and r["role"] == role]
        if not ours:
            continue
        low, high = min(r["ns_per_byte"] for r in ours), max(r["ns_per_byte"] for r in ours)
        line = f"{role}: ringseed {low:.2f}-{high:.2f} ns/B (target <= {target:g})"
        if role == "receiver" and limits is not None:
            ideal = GB / limits["ideal_receiver"]
            line += f", {low / ideal:.2f}-{high / ideal:.2f}x the ideal receiver ({ideal:.2f})"
            if "in_place_receiver" in limits:
                line += f", the ideal in place {GB / limits['in_place_receiver']:.2f}"
            if "direct_receiver" in limits:
                line += f", the ideal direct {GB / limits['direct_receiver']:.2f}"
        ratios = []
        for r in ours:
            theirs = [t for t in moved if t["method"].startswith("libtorrent") and t["role"] == role
                      and t["scenario"] == r["scenario"]]  # fmt: skip
            if theirs:
                ratios.append(theirs[0]["ns_per_byte"] / r["ns_per_byte"])
        if ratios:
            line += f"; libtorrent spends {min(ratios):.1f}-{max(ratios):.1f}x ringseed's CPU per byte"
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=units.parse_size, default="1Gi", help="model size (default 1Gi)")
    parser.add_argument("--chunk-size", dest="chunk", type=units.parse_size, default="64Mi")
    parser.add_argument("--memory", type=units.parse_size, default="256Mi", help="agents' memory tier")
    parser.add_argument("--receivers", default="1,2,4", help="serve K: receivers of one holder")
    parser.add_argument("--holders", default="1,2,4", help="pull H: holders serving one receiver")
    parser.add_argument("--methods", default="ringseed,libtorrent")
    parser.add_argument("--torrent", choices=["hybrid", "v1", "v2"], default="v1",
                        help="libtorrent torrent kind (v1: SHA-1 pieces only, its cheapest)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--workdir", default="/dev/shm", help="where the model and every copy live (RAM)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--staging-writes", choices=["auto", "direct", "in-place", "buffered"], default=None,
                        help="the agents' --staging-writes (default: theirs, auto)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", choices=["py-spy", "perf", "strace"], default=None,
                        help="only ringseed's one-to-one runs, with this tool attached to both agents (files "
                        "in <workdir>/profile/<run>; implies --keep; CPU includes its overhead)")  # fmt: skip
    args = parser.parse_args(argv)
    Swarm.staging_writes = args.staging_writes
    if args.profile:
        args.methods, args.receivers, args.holders, args.keep = "ringseed", "1", "", True
    args.receivers = [int(n) for n in args.receivers.split(",") if n]
    args.holders = [int(n) for n in args.holders.split(",") if n]
    work = Path(tempfile.mkdtemp(prefix="ringseed-datapath-", dir=args.workdir))
    try:
        rows = run_all(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
