"""Chaos soak: a local swarm under random faults, with the issue 9 invariant checked after every round.

A master and agents run as real processes on 127.0.0.1 (:class:`ringseed.local.swarm.LocalSwarm`),
one of them a faulty receiver for the whole run (bad RAM: every chunk it receives fails its
check, so it reports every peer it fetches from) and, as root, one whose data lives on a small
tmpfs. Each round injects one or two random faults, waits until the swarm settles, and checks:

- no node that reports a verified copy (the digest in its heartbeat, as its own ``/v1/status``
  shows it, and the tracker's per-node ``verified``) holds bytes other than a complete revision
  of the source: its files hash, chunk by chunk, to the manifest of a source state the run
  produced, and its marker names that manifest;
- every honest node (all but the faulty receiver) holds a verified copy of the revision the
  swarm distributes, itself a complete source revision, within ``--round-timeout`` seconds.

The revision is pinned while nobody reads the source: a replacement is taken up when a read
meets it (mid-pull), when the master restarts or when origin duty moves, so rounds that change
the source also move the duty (the holder is killed). A flip that keeps the mtime is only seen
by hashing: the round waits for the node's next two background passes before checking.

Faults: ``kill_agent`` (SIGKILL, restarted 0.5-3 s later), ``kill_master`` (SIGKILL, restarted
after 1 s: all tracker state is lost), ``replace_source`` (a file rewritten in place, replaced by
write + rename, or resized, possibly while it is being pulled), ``flip_at_rest`` (a byte of a
node's published copy flipped, with or without moving its mtime), ``full_disk`` (root: the tmpfs
node is wiped and restarted with its disk all but full, and room comes back 3-8 s later), and the
faulty receiver itself (counted once). Bounded in time (``--duration``); prints the rounds run,
the faults injected and the violations (exit 1 if any).

Usage: ``sudo .venv/bin/python -m bench.chaos --duration 600 [--seed N] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ringseed.agent import origins
from ringseed.local import swarm
from ringseed.protocol import manifest

MiB = 1 << 20
BAD_RAM = "tests.component.distribution.bad_ram_agent"


def source_manifest(root: Path, *, chunk_size: int) -> manifest.Manifest:
    """The manifest of the source as it is now (read and hashed once, as ``ringseed manifest`` does)."""
    return asyncio.run(origins.build_manifest(origins.open_origin(root.as_uri()), chunk_size=chunk_size))


@dataclass
class Chaos:
    """The run's swarm, source, the revisions the source went through, and the tally."""

    local: swarm.LocalSwarm
    root: Path
    rng: random.Random
    chunk_size: int
    bad: str
    disk: tuple[str, Path] | None
    revisions: dict[str, manifest.Manifest] = field(default_factory=dict)  # digest -> manifest
    current: manifest.Manifest | None = None
    pending: list[tuple[float, str, Callable[[], None]]] = field(default_factory=list)
    watches: dict[str, Callable[[], bool]] = field(default_factory=dict)  # what -> done yet?
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)
    pinned_rounds: int = 0

    @property
    def honest(self) -> list[str]:
        return [n for n in self.local.names if n != self.bad]

    def source_changed(self) -> None:
        self.current = source_manifest(self.root, chunk_size=self.chunk_size)
        self.revisions[self.current.digest] = self.current

    def later(self, delay: float, what: str, action: Callable[[], None]) -> None:
        self.pending.append((time.monotonic() + delay, what, action))

    def run_due(self) -> None:
        now = time.monotonic()
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _, _, action in due:
            action()

    def start(self, name: str) -> None:
        self.local.start_agent(name, module=BAD_RAM if name == self.bad else "ringseed.cli")

    def alive(self, name: str) -> bool:
        proc = self.local.procs.get(name)
        return proc is not None and proc.poll() is None

    def agent_status(self, name: str) -> dict[str, Any] | None:
        """The agent's own ``/v1/status``, None while it is down or starting."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.local.agent_ports[name]}/v1/status",
            headers={"Authorization": f"Bearer {self.local.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status: dict[str, Any] = json.loads(response.read())
                return status
        except (OSError, ValueError):
            return None


# -- faults --------------------------------------------------------------------------------------


def kill_agent(chaos: Chaos) -> str:
    running = [
        n for n in chaos.honest if chaos.local.procs[n].poll() is None and (chaos.disk is None or n != chaos.disk[0])
    ]
    name = chaos.rng.choice(running)
    chaos.local.kill(name)
    chaos.later(chaos.rng.uniform(0.5, 3.0), f"restart {name}", functools.partial(chaos.start, name))
    return name


def kill_master(chaos: Chaos) -> str:
    chaos.local.kill("master")
    chaos.later(1.0, "restart master", chaos.local.start_master)
    return "master"


def move_duty(chaos: Chaos) -> None:
    """Kill the origin-duty holder (restarted 1 s later), so a new holder takes the revision again."""
    status = chaos.local.status() or {}
    for name in status.get("origin_duty", []):
        if name in chaos.local.names and chaos.alive(name) and (chaos.disk is None or name != chaos.disk[0]):
            chaos.local.kill(name)
            chaos.later(1.0, f"restart {name}", functools.partial(chaos.start, name))


def replace_source(chaos: Chaos) -> str:
    path = chaos.rng.choice(sorted(p for p in chaos.root.rglob("*") if p.is_file()))
    size = path.stat().st_size
    how = chaos.rng.choice(["in-place", "rename", "resize"])
    if how == "in-place":
        with open(path, "r+b") as f:
            f.seek(chaos.rng.randrange(max(1, size - 4096)))
            f.write(os.urandom(4096))
    elif how == "rename":
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(os.urandom(size))
        os.replace(tmp, path)
    else:
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(os.urandom(max(1, size + chaos.rng.randint(-MiB, MiB))))
        os.replace(tmp, path)
    chaos.source_changed()
    if chaos.rng.random() < 0.5:  # else the change stays unseen until a read, a restart or a duty move
        move_duty(chaos)
    return f"{path.name} {how}"


def flip_at_rest(chaos: Chaos) -> str:
    name = chaos.rng.choice(chaos.honest)
    files = sorted(p for p in chaos.local.model_dir(name).rglob("*") if p.is_file() and p.name != ".ringseed-complete")
    if not files:
        return f"{name}: nothing published yet"
    path = chaos.rng.choice(files)
    before = os.stat(path)
    if before.st_size == 0:
        return f"{name}: {path.name} is empty"
    offset = chaos.rng.randrange(before.st_size)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    keep = chaos.rng.random() < 0.5
    if keep:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    passes = (chaos.agent_status(name) or {}).get("check", {}).get("passes", 0)

    def checked() -> bool:  # two full background passes after the flip (or the node was restarted)
        now = chaos.agent_status(name)
        return (
            now is None
            or not chaos.alive(name)
            or now["check"]["passes"] >= passes + 2
            or now["check"]["passes"] < passes
        )

    chaos.watches[f"{name} checked"] = checked
    return f"{name}: {path.name}@{offset}{' (mtime kept)' if keep else ''}"


def full_disk(chaos: Chaos) -> str:
    assert chaos.disk is not None
    name, mount = chaos.disk
    chaos.local.kill(name)
    for child in mount.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    st = os.statvfs(mount)
    ballast = mount / "ballast"
    with open(ballast, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, st.f_bavail * st.f_frsize - MiB // 2))
    chaos.start(name)
    chaos.later(chaos.rng.uniform(3.0, 8.0), f"room for {name}", lambda: ballast.unlink(missing_ok=True))
    return name


FAULTS: dict[str, Callable[[Chaos], str]] = {
    "kill_agent": kill_agent,
    "kill_master": kill_master,
    "replace_source": replace_source,
    "flip_at_rest": flip_at_rest,
    "full_disk": full_disk,
}


# -- the invariant -----------------------------------------------------------------------------


def check_verified_copies(chaos: Chaos, status: dict[str, Any]) -> list[str]:
    """No running node reporting a verified copy holds anything but a complete source revision."""
    found = []
    for name in chaos.local.names:
        own = chaos.agent_status(name) if chaos.alive(name) else None
        tracker_says = status.get("nodes", {}).get(name, {}).get("verified") and chaos.alive(name)
        if not tracker_says and not (own or {}).get("verified_digest"):
            continue
        model_dir = chaos.local.model_dir(name)
        try:
            marker = json.loads((model_dir / ".ringseed-complete").read_text())["manifest_digest"]
        except (OSError, ValueError, KeyError, TypeError):
            found.append(f"{name} reports verified but has no readable marker")
            continue
        expected = chaos.revisions.get(marker)
        if expected is None:
            found.append(f"{name} reports verified under {marker[:16]}, which is no revision of the source")
        elif swarm.verify_copy(model_dir, expected) != {"complete": True, "verified": True}:
            found.append(f"{name} reports verified but its bytes differ from revision {marker[:16]}")
    return found


def crashed(chaos: Chaos) -> list[str]:
    """Processes that ended without being killed (a bug: a violation), restarted at once."""
    found = []
    for name, proc in list(chaos.local.procs.items()):
        if proc.poll() is not None and name not in chaos.local.stopped:
            found.append(f"{name} crashed ({proc.returncode}): {chaos.local.first_error(name)}")
            chaos.local.start_master() if name == "master" else chaos.start(name)
    return found


def settled(chaos: Chaos, status: dict[str, Any] | None) -> bool:
    """No fault still running, the swarm's revision confirmed and one the source had, every honest
    node verified by the tracker and by its own account."""
    if status is None or chaos.pending or not status.get("revision_confirmed"):
        return False
    if status.get("manifest_digest") not in chaos.revisions or not chaos.local.all_verified(status, chaos.honest):
        return False
    chaos.watches = {what: done for what, done in chaos.watches.items() if not done()}
    own = [chaos.agent_status(n) for n in chaos.honest]
    return not chaos.watches and all(s is not None and s["verified_digest"] == status["manifest_digest"] for s in own)


def run_round(chaos: Chaos, *, number: int, timeout: float) -> None:
    kinds = [k for k in FAULTS if k != "full_disk" or chaos.disk is not None]
    picked = chaos.rng.sample(kinds, k=chaos.rng.choice([1, 1, 2]))
    notes = []
    for kind in picked:
        notes.append(f"{kind}({FAULTS[kind](chaos)})")
        chaos.faults[kind] += 1
    started = time.monotonic()
    status: dict[str, Any] | None = None
    found: list[str] = []
    done = False
    while time.monotonic() - started < timeout:
        chaos.run_due()
        found += crashed(chaos)
        status = chaos.local.status()
        done = settled(chaos, status)
        if done:
            break
        time.sleep(0.25)
    seconds = time.monotonic() - started
    found += check_verified_copies(chaos, status or {})
    if not done:  # judged once: a second look (new agent answers) could see the next change begin
        nodes = (status or {}).get("nodes", {})
        missing = {n: nodes.get(n, {}).get("reason") for n in chaos.honest if not nodes.get(n, {}).get("verified")}
        digest = str((status or {}).get("manifest_digest"))[:16]
        found.append(
            f"not settled after {timeout:.0f} s: honest nodes not verified {missing}, swarm at {digest}"
            f" (a source revision: {(status or {}).get('manifest_digest') in chaos.revisions}),"
            f" confirmed {(status or {}).get('revision_confirmed')}, waiting for {list(chaos.watches)}"
        )
        for _, _what, action in chaos.pending:  # leave no fault behind for the next round
            action()
        chaos.pending.clear()
        chaos.watches.clear()
    if not found and chaos.current is not None and (status or {}).get("manifest_digest") != chaos.current.digest:
        chaos.pinned_rounds += 1  # settled on an earlier revision: the change was not read yet
    chaos.violations += [f"round {number}: {v}" for v in found]
    verdict = "ok" if not found else "VIOLATION: " + "; ".join(found)
    print(f"round {number:3d}  {seconds:6.1f} s  {', '.join(notes)}  {verdict}", flush=True)


# -- set-up ------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path | None]:
    """A tmpfs of ``size`` bytes at ``path`` (root only; None otherwise)."""
    if os.geteuid() != 0:
        yield None
        return
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def write_model(root: Path, *, size: int, files: int, rng: random.Random) -> None:
    for i in range(files):
        part = size // files + rng.randint(-9999, 9999)
        path = root / ("meta/config.json" if i == files - 1 else f"shard-{i:02d}.bin")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(max(1, part if i < files - 1 else 777)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of rounds (the last one finishes)")
    parser.add_argument("--nodes", type=int, default=5, help="agents, the faulty receiver included")
    parser.add_argument("--size-mib", type=int, default=16)
    parser.add_argument("--chunk-mib", type=int, default=1)
    parser.add_argument("--origin-rate-mib", type=float, default=16.0)
    parser.add_argument("--round-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the tally as JSON here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    chunk = args.chunk_mib * MiB
    with tempfile.TemporaryDirectory(prefix="ringseed-chaos-") as tmp:
        work = Path(tmp)
        root = work / "model"
        write_model(root, size=args.size_mib * MiB, files=4, rng=rng)
        nodes = args.nodes + 1 if os.geteuid() == 0 else args.nodes
        local = swarm.LocalSwarm(
            source=root.as_uri(),
            nodes=nodes,
            workdir=work / "swarm",
            chunk_size=chunk,
            origin_rate_limit=int(args.origin_rate_mib * MiB),
            offline_after=3.0,
            agent_args=["--scrub-rate", "64Mi", "--scrub-after", "1"],
        )
        with local, small_disk(work / "tmpfs", (2 * args.size_mib + 8) * MiB) as mount:
            disk = None
            if mount is not None:
                disk = (local.names[-1], mount)
                (local.workdir / "nodes").mkdir(parents=True, exist_ok=True)
                os.symlink(mount, local.node_dir(disk[0]))
            chaos = Chaos(local=local, root=root, rng=rng, chunk_size=chunk, bad=local.names[1], disk=disk)
            chaos.source_changed()
            chaos.faults["faulty_receiver"] += 1
            print(f"seed {seed}; {nodes} agents ({chaos.bad} a faulty receiver", end="")
            print(f", {disk[0]} on a {2 * args.size_mib + 8} MiB tmpfs)" if disk else "; not root: no full disk)")
            local.start_master()
            for name in local.names:
                chaos.start(name)
            deadline = time.monotonic() + args.duration
            rounds = 0
            while time.monotonic() < deadline:
                rounds += 1
                run_round(chaos, number=rounds, timeout=args.round_timeout)
    tally = {
        "seed": seed,
        "rounds": rounds,
        "faults": dict(chaos.faults),
        "faults_total": sum(chaos.faults.values()),
        "violations": chaos.violations,
        "source_revisions": len(chaos.revisions),
        "rounds_settled_on_an_earlier_revision": chaos.pinned_rounds,
    }
    print(f"rounds run {rounds}; faults injected {tally['faults_total']} {dict(chaos.faults)}", end="")
    print(f"; violations {len(chaos.violations)}")
    for violation in chaos.violations:
        print(f"  {violation}")
    if args.json is not None:
        args.json.write_text(json.dumps(tally, indent=2, sort_keys=True))
    return 1 if chaos.violations else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sys.exit(main())
