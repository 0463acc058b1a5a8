"""``ringseed local distribute``: deliver a model to N local agents and show live progress.

Owns the command: it checks the arguments (argparse, one line and exit 2 for a bad one), lists
the source once before starting anything (a missing path, an empty source, a closed port,
refused credentials, a symlink leaving the source: one line naming it, exit 1), then starts a
master and N agents on 127.0.0.1 as separate processes (:class:`ringseed.local.swarm.LocalSwarm`)
and shows per-node progress on stderr (:mod:`ringseed.local.display`) until every node holds a
verified copy. It checks each node's final copy against the manifest and prints a summary that
says where the copies are (or, with ``--json``, one JSON object on stdout: ``ok``, ``error``,
``seconds``, ``lower_bound_seconds``, ``model_bytes``, ``origin_bytes``, ``manifest_digest``,
``workdir``, ``nodes: {name: {complete, verified, bytes_fetched, path}}``).

Failure: a child that dies (any signal) is named at once with the first error of its log; a
node reporting a permanent problem (``PERMANENT_REASONS``, from the tracker's per-node
``reason``/``message``) stops the run at once; a timeout names the nodes still missing. The
error goes to stderr as one line, exit 1. The workdir of a failed run is kept and named (a
temporary one is removed only after a run that succeeded). Every child process is cleaned up
on exit, error, SIGTERM and Ctrl-C.

``--demo`` writes a 256 MiB model of several odd-sized files into the work directory first.
``lower_bound_seconds`` is size / origin rate plus one chunk time per doubling of the swarm
(null without ``--origin-rate-limit``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROG = "ringseed local distribute"
# Node problems (the agents' heartbeat ``problem.reason``) that end a local run at once: the
# source keeps failing after the agent's bounded retries, or cannot make a model at all.
PERMANENT_REASONS = frozenset({"OriginError", "BadSource"})
TICK_S = 0.25
PREFLIGHT_RETRIES = 2  # the listing before the start: a closed port fails in about a second

DEMO_FILES = {
    "config.json": 1_337,
    "model-00001-of-00003.safetensors": 100 * (1 << 20) + 12_345,
    "model-00002-of-00003.safetensors": 100 * (1 << 20) - 4_321,
    "model-00003-of-00003.safetensors": 56 * (1 << 20) - 9_024 - 1_337 - 77,
    "tokenizer/vocab.txt": 77,
}


def configure(parser: argparse.ArgumentParser) -> None:
    from ringseed import cmdline

    parser.add_argument(
        "source",
        nargs="?",
        type=_source,
        help="the model: a local directory or file (a Hugging Face snapshot folder too), file://, "
        "http(s):// (a directory URL needs an index.json) or s3://bucket/prefix",
    )
    parser.add_argument("--nodes", type=cmdline.positive_int, default=4, help="agents to start")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="node data, caches and logs (default: a temporary directory, kept if the run fails)",
    )
    parser.add_argument("--chunk-size", type=cmdline.chunk_size, default="4Mi", help="chunk size, 1Mi to 1Gi")
    parser.add_argument(
        "--origin-rate-limit",
        type=cmdline.positive_size,
        default=None,
        help="cap on bytes/s read from the source, e.g. 32Mi (default: no cap)",
    )
    parser.add_argument(
        "--memory-bytes", type=cmdline.positive_size, default="64Mi", help="memory tier budget per agent"
    )
    parser.add_argument(
        "--seeders", type=cmdline.positive_int, default=1, help="agents pulling from the source at once"
    )
    parser.add_argument("--manifest-uri", help="URI of a published manifest of the source (ringseed manifest --output)")
    parser.add_argument(
        "--timeout", type=cmdline.positive_seconds, default=600.0, help="give up after this many seconds"
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "bars", "lines", "off"),
        default="auto",
        help="per-node bars on a terminal, plain lines otherwise (auto), or force one",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--demo", action="store_true", help="generate a 256 MiB demo model in the workdir")


def _source(text: str) -> str:
    """A URI as given, or a local path that exists, as a file:// URI (argparse type)."""
    if "://" in text:
        return text
    path = Path(text)
    try:
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory") from None
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise argparse.ArgumentTypeError(f"{text}: cannot be resolved ({_one_line(exc)})") from None
    return resolved.as_uri()


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


def write_demo_model(root: Path, files: dict[str, int] = DEMO_FILES) -> Path:
    """Random files of odd sizes under ``root`` (kept if already there with the right sizes)."""
    for rel, size in files.items():
        path = root / rel
        if path.exists() and path.stat().st_size == size:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            left = size
            while left:
                block = os.urandom(min(left, 8 << 20))
                f.write(block)
                left -= len(block)
    return root


def lower_bound(*, size: int, rate: float | None, chunk_size: int, nodes: int) -> float | None:
    """T* = size / origin rate + one chunk time per doubling of the swarm."""
    if not rate:
        return None
    return size / rate + (chunk_size / rate) * math.ceil(math.log2(max(nodes, 1)) or 0)


def check_source(source: str, *, manifest_uri: str | None, chunk_size: int) -> str | None:
    """List the source (or load its manifest) once, as the agents will; the problem as one line, or None."""
    from ringseed.agent import origins
    from ringseed.protocol import manifest

    async def check() -> None:
        if manifest_uri:
            await origins.fetch_manifest(manifest_uri, retries=PREFLIGHT_RETRIES, retry_base_delay=0.1)
            return
        origin = origins.open_origin(source, retries=PREFLIGHT_RETRIES, retry_base_delay=0.1, read_timeout=30.0)
        try:
            manifest.Layout.build(await origin.list_files(), chunk_size=chunk_size)
        finally:
            await origin.close()

    try:
        asyncio.run(check())
    except (origins.OriginError, manifest.ManifestError) as exc:
        text = _one_line(exc)
        return (
            text if text.startswith(source) or (manifest_uri and text.startswith(manifest_uri)) else f"{source}: {text}"
        )
    return None


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through LocalSwarm.close like Ctrl-C does


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="ringseed-local-")) if temporary else args.workdir.resolve()
    result: dict[str, Any] | None = None
    try:
        source = args.source
        if args.demo and not source:
            source = write_demo_model(workdir / "demo-model").as_uri()
        if not source:
            print(f"{PROG}: give a SOURCE or --demo (see --help)", file=sys.stderr)
            return 2
        problem = check_source(source, manifest_uri=args.manifest_uri, chunk_size=args.chunk_size)
        if problem:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 1
        result = _distribute(args, source=source, workdir=workdir)
    finally:
        if result is not None and result["ok"] and temporary:
            shutil.rmtree(workdir, ignore_errors=True)
            result["workdir"] = result["copies"] = None
        elif temporary and result is None and not any(workdir.iterdir()):
            workdir.rmdir()  # nothing was written: nothing to keep
        elif result is None:
            print(f"{PROG}: kept the workdir {workdir}", file=sys.stderr)
    _report(result, workdir=workdir, as_json=args.json)
    return 0 if result["ok"] else 1


def _distribute(args: argparse.Namespace, *, source: str, workdir: Path) -> dict[str, Any]:
    from ringseed.local import swarm

    with swarm.LocalSwarm(
        source=source,
        nodes=args.nodes,
        workdir=workdir / "swarm",
        chunk_size=args.chunk_size,
        origin_rate_limit=args.origin_rate_limit,
        memory_bytes=args.memory_bytes,
        seeders=args.seeders,
        manifest_uri=args.manifest_uri,
    ) as local:
        result = _drive(
            local, timeout=args.timeout, rate=args.origin_rate_limit, chunk_size=args.chunk_size, mode=args.progress
        )
    result["workdir"] = str(workdir)
    return result


def _drive(local: Any, *, timeout: float, rate: int | None, chunk_size: int, mode: str) -> dict[str, Any]:
    from ringseed.local import display, progress, swarm

    started = time.monotonic()
    tracker = progress.Progress(names=local.names, started=started, rate_limit=rate)
    screen = display.choose(mode, sys.stderr)
    view: progress.View | None = None
    status: dict[str, Any] = {}
    error = None
    local.start()
    try:
        while True:
            now = time.monotonic()
            status = local.status() or status
            if status:
                tracker.update(status, now=now)
                view = tracker.view(now=now)
                screen.show(view)
                if local.all_verified(status):
                    break
                error = permanent_problem(status)
                if error:
                    break
            local.check_alive()
            if now - started > timeout:
                error = f"timed out after {timeout:.0f}s; {_missing(view)}"
                break
            time.sleep(TICK_S)
    except swarm.ChildDied as exc:
        error = str(exc)
    finally:
        screen.close(view)
    return _result(
        local, status=status, error=error, seconds=time.monotonic() - started, rate=rate, chunk_size=chunk_size
    )


def permanent_problem(status: dict[str, Any]) -> str | None:
    """``node: Reason: message`` of the first node whose reported problem no retry will fix."""
    for name, entry in sorted(status.get("nodes", {}).items()):
        if entry.get("reason") in PERMANENT_REASONS:
            return f"{name}: {entry['reason']}: {entry.get('message') or 'no message'}"
    return None


def _missing(view: Any) -> str:
    if view is None:
        return "the master never answered"
    rows = [r for r in view.nodes if not r.verified]
    described = ", ".join(f"{r.name} ({r.state}, {100 * r.bytes / (r.total or 1):.0f}%)" for r in rows)
    return f"not verified: {described}" if rows else "every node verified"


def _result(
    local: Any, *, status: dict[str, Any], error: str | None, seconds: float, rate: int | None, chunk_size: int
) -> dict[str, Any]:
    from ringseed.local import swarm

    expected = local.manifest()
    nodes: dict[str, Any] = {}
    missing = {"complete": False, "verified": False}
    for name in local.names:
        check = swarm.verify_copy(local.model_dir(name), expected) if expected else missing
        entry = status.get("nodes", {}).get(name, {})
        nodes[name] = dict(check, bytes_fetched=entry.get("bytes_fetched", 0), path=str(local.model_dir(name)))
    size = int(status.get("total_bytes", 0))
    return {
        "ok": error is None and bool(nodes) and all(n["verified"] for n in nodes.values()),
        "error": error,
        "seconds": round(seconds, 3),
        "lower_bound_seconds": lower_bound(size=size, rate=rate, chunk_size=chunk_size, nodes=len(local.names)),
        "model_bytes": size,
        "origin_bytes": int(status.get("bytes_from_origin", 0)),
        "manifest_digest": status.get("manifest_digest"),
        "logs": str(local.workdir / "logs"),
        "copies": str(local.model_dir("*")),
        "nodes": nodes,
        "log_errors": {} if error is None else _log_errors(local, nodes),
    }


def _log_errors(local: Any, nodes: dict[str, Any]) -> dict[str, str]:
    """The first error in the log of each child that did not finish (the master too), for the console."""
    names = ["master", *(n for n, entry in nodes.items() if not entry["verified"])]
    found = {name: local.first_error(name) for name in names}
    return {name: text for name, text in found.items() if text}


def _report(result: dict[str, Any], *, workdir: Path, as_json: bool) -> None:
    if result["error"]:
        print(f"{PROG}: {result['error']}", file=sys.stderr)
        for name, text in result["log_errors"].items():
            if text not in result["error"]:
                print(f"  first error in {name}'s log: {text}", file=sys.stderr)
    if not result["ok"]:
        print(f"{PROG}: kept the workdir {workdir} (logs in {result['logs']})", file=sys.stderr)
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    from ringseed.protocol import units

    verified = sum(1 for n in result["nodes"].values() if n["verified"])
    size = result["model_bytes"]
    head = "OK" if result["ok"] else "FAILED"
    print(f"{head}: {verified}/{len(result['nodes'])} nodes hold a verified copy of {units.format_size(size)}")
    bound = f" (lower bound {result['lower_bound_seconds']:.1f}s)" if result["lower_bound_seconds"] else ""
    print(f"  took {result['seconds']:.1f}s{bound}; origin read {result['origin_bytes'] / (size or 1):.2f}x the model")
    if result["workdir"] is None:
        print("  copies were in a temporary workdir, now removed (use --workdir DIR to keep them)")
    elif verified:
        print(f"  copies: {result['copies']} ({verified} of them verified)")
