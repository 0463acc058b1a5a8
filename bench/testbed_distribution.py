"""Distribution on the netns testbed: ringseed vs direct download vs a libtorrent swarm, same run.

    sudo .venv/bin/python -m bench.testbed_distribution --nodes 4,8,16 --size 256Mi \
        --origin-rate 100mbit --node-rate 1gbit [--methods ringseed,libtorrent,direct] [--json OUT]

For each N: an origin host (link B_o) and N node hosts (links B_l, both directions shaped with
tc tbf), the model served by the origin host over HTTP. Every method starts its processes,
waits until they are ready, then all start at one gate; T runs from the gate until the last
node holds the whole model. Printed per method: T, T* = S/B_o + ceil(log2 N) x chunk/B_l,
T/T*, and origin bytes / S (layer-2 bytes the origin's link sent over the model size).
Rates in T* are the nominal link rates (tbf counts layer-2 bytes; MTU 9000 leaves 99.3% to TCP).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import testbed_common as common
from ringseed.protocol import units
from ringseed.testbed import links, netns

MASTER_PORT, AGENT_PORT, HTTP_PORT, TORRENT_PORT = 8470, 8471, 8000, 6881


def t_star(*, size: int, chunk: int, nodes: int, origin_bps: float, node_bps: float) -> float:
    hops = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    return size / (origin_bps / 8) + hops * min(chunk, size) / (node_bps / 8)


def run_ringseed(
    tb: netns.Testbed, *, work: Path, chunk: int, heartbeat: float, timeout: float, agent_args: list[str]
) -> dict[str, Any]:
    token = secrets.token_hex(16)
    env = {"RINGSEED_TOKEN": token}
    origin = tb.origin
    master_url = f"http://{origin.address}:{MASTER_PORT}"
    master = [common.PY, "-m", "ringseed.cli", "master", "--role", "tracker", "--port", str(MASTER_PORT)]
    master += ["--heartbeat-interval", str(heartbeat)]
    procs = [common.spawn(origin, master, log=work / "logs/master.log", env=env)]
    for host in tb.nodes:
        node_dir = work / "nodes" / host.name
        procs.append(common.spawn(host, [common.PY, "-m", "ringseed.cli", "agent", "--master-url", master_url,
                            "--node-name", host.name, "--advertise-host", host.address, "--port", str(AGENT_PORT),
                            "--source", f"http://{origin.address}:{HTTP_PORT}/", "--chunk-size", str(chunk),
                            "--model-name", "bench/model", "--data-dir", str(node_dir / "data"),
                            "--cache-dir", str(node_dir / "cache"), "--memory-bytes", "128Mi", *agent_args],
                     log=work / f"logs/{host.name}.log", env=env))  # fmt: skip
    status_url = f"{master_url}/v1/status"

    def wait(pred: Any, *, timeout: float, what: str) -> dict[str, Any]:
        return _wait(pred, origin, status_url, token, procs=procs, timeout=timeout, what=what)

    wait(lambda s: s.get("nodes_total") == len(tb.nodes), timeout=60, what="registration")
    cpu_before = common.cpu_seconds([p.pid for p in procs])
    start = common.gate(work / "gate")
    timeline: list[tuple[float, int, int, int]] = []

    def done(status: dict[str, Any]) -> bool:
        nodes = status.get("nodes", {}).values()
        held = sum(int(n.get("bytes", 0)) for n in nodes)
        timeline.append((round(time.time() - start, 2), int(status.get("bytes_from_origin") or 0), held,
                         sum(1 for n in nodes if n.get("complete"))))  # fmt: skip
        return bool(status.get("nodes_ready") == len(tb.nodes))

    status = wait(done, timeout=timeout, what="every node verified")
    seconds = time.time() - start
    cpu = common.cpu_seconds([p.pid for p in procs]) - cpu_before
    digests = {_marker(work / "nodes" / h.name) for h in tb.nodes}
    return {"seconds": seconds, "ok": digests == {status.get("manifest_digest")},
            "status_origin_bytes": status.get("bytes_from_origin"), "timeline": timeline,
            "origin_done": next((t for t, o, _, _ in timeline if o >= status.get("total_bytes", 0) > 0), None),
            "first_complete": next((t for t, _, _, c in timeline if c > 0), None), "cpu_seconds": cpu}  # fmt: skip


def _marker(node_dir: Path) -> str | None:
    try:
        data: dict[str, Any] = json.loads((node_dir / "data/bench/model/.ringseed-complete").read_text())
    except (OSError, ValueError):
        return None
    return data.get("manifest_digest")


def _wait(
    pred: Any, host: netns.Host, url: str, token: str, *, procs: list[Any], timeout: float, what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"ringseed: a master or agent exited while waiting for {what} (see --keep logs)")
        status = common.curl_json(host, url, token=token)
        if isinstance(status, dict) and pred(status):
            return status
        time.sleep(0.1)
    raise TimeoutError(f"ringseed: no {what} within {timeout:.0f}s")


def run_direct(tb: netns.Testbed, *, work: Path, timeout: float) -> dict[str, Any]:
    base = f"http://{tb.origin.address}:{HTTP_PORT}/"
    gate = str(work / "gate")
    procs = [
        common.spawn(
            h,
            [common.PY, "-m", "bench.baselines.direct", base, "--node", h.name, "--gate", gate],
            log=work / f"logs/direct-{h.name}.log",
        )
        for h in tb.nodes
    ]
    time.sleep(1.0)  # let the clients import and reach the gate
    start = common.gate(work / "gate")
    reports = []
    for host, proc in zip(tb.nodes, procs, strict=True):
        try:
            reports.append(json.loads(common.read_line(proc, timeout=timeout, what=f"direct client on {host.name}")))
        except RuntimeError as exc:
            tail = (work / f"logs/direct-{host.name}.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{exc}; its log ends with:\n{tail}") from exc
    return {"seconds": max(r["end"] for r in reports) - start, "ok": len({r["sha256"] for r in reports}) == 1}


def run_libtorrent(tb: netns.Testbed, *, work: Path, model: Path, torrent: Path, timeout: float) -> dict[str, Any]:
    peers = [f"{h.address}:{TORRENT_PORT}" for h in tb.hosts]
    gate, stop = str(work / "gate"), str(work / "stop")
    seed = common.spawn(tb.origin, [common.PY, "-m", "bench.baselines.torrent", "seed", str(torrent),
                                    str(model.parent), "--listen", peers[0], "--gate", gate, "--stop", stop],
                        log=work / "logs/lt-seed.log")  # fmt: skip
    procs = []
    for index, host in enumerate(tb.nodes, start=1):
        others = ",".join(p for i, p in enumerate(peers) if i != index)
        procs.append(common.spawn(host, [common.PY, "-m", "bench.baselines.torrent", "peer", str(torrent),
                                         str(work / "lt" / host.name), "--listen", peers[index], "--connect", others,
                                         "--gate", gate, "--stop", stop, "--node", host.name],
                                  log=work / f"logs/lt-{host.name}.log"))  # fmt: skip
    for proc in [seed, *procs]:
        common.read_line(proc, timeout=120, what="libtorrent READY")
    start = common.gate(work / "gate")
    reports = [json.loads(common.read_line(p, timeout=timeout, what="libtorrent peer")) for p in procs]
    common.gate(work / "stop")
    return {"seconds": max(r["end"] for r in reports) - start, "ok": all(r["bytes"] > 0 for r in reports)}


def one_method(method: str, args: argparse.Namespace, *, nodes: int, model: Path, torrent: Path) -> dict[str, Any]:
    """Run one method on a fresh testbed of ``nodes`` nodes; adds origin bytes from the link counters."""
    work = Path(tempfile.mkdtemp(prefix=f"rs-dist-{method}-", dir=args.workdir))
    try:
        with netns.Testbed(nodes=nodes, origin_rate=args.origin_bps, node_rate=args.node_bps) as tb:
            server = common.spawn(tb.origin, [common.PY, "-m", "bench.baselines.http_origin", str(model), "--port",
                                              str(HTTP_PORT), "--gate", str(work / "gate")],
                                  log=work / "logs/origin.log")  # fmt: skip
            common.read_line(server, timeout=60, what="origin server")
            before = common.sent_bytes(tb.origin)
            if method == "ringseed":
                result = run_ringseed(
                    tb, work=work, chunk=args.chunk, heartbeat=args.heartbeat, timeout=args.timeout,
                    agent_args=args.agent_args.split(),
                )  # fmt: skip
            elif method == "direct":
                result = run_direct(tb, work=work, timeout=args.timeout)
            else:
                result = run_libtorrent(tb, work=work, model=model, torrent=torrent, timeout=args.timeout)
            result["origin_link_bytes"] = common.sent_bytes(tb.origin) - before
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,8,16")
    parser.add_argument("--size", default="256Mi")
    parser.add_argument("--chunk-size", default="64Mi")
    parser.add_argument("--origin-rate", default="100mbit")
    parser.add_argument("--node-rate", default="1gbit")
    parser.add_argument("--methods", default="ringseed,libtorrent,direct")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="master --heartbeat-interval")
    parser.add_argument("--agent-args", default="", help="extra agent flags, e.g. '--upload-slots 2'")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep work directories (logs)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reason = netns.can_run()
    if reason:
        print(f"testbed_distribution: {reason}")
        return 1
    args.origin_bps, args.node_bps = links.parse_rate(args.origin_rate), links.parse_rate(args.node_rate)
    args.chunk, size = units.parse_size(args.chunk_size), units.parse_size(args.size)
    root = Path(tempfile.mkdtemp(prefix="rs-dist-model-", dir=args.workdir))
    rows: list[dict[str, Any]] = []
    failures = 0
    try:
        model = common.write_model(root / "model", size=size)
        torrent = root / "model.torrent"
        subprocess.run([common.PY, "-m", "bench.baselines.torrent", "make", str(model), str(torrent)],
                       cwd=common.REPO, check=True)  # fmt: skip
        print(f"S={size / common.MiB:g} MiB chunk={args.chunk / common.MiB:g} MiB B_o={args.origin_rate} "
              f"B_l={args.node_rate} MTU={links.DEFAULT_MTU}")  # fmt: skip
        print(f"{'N':>3} {'method':<11} {'T s':>8} {'T* s':>8} {'T/T*':>6} {'origin/S':>8} ok")
        for nodes in [int(n) for n in args.nodes.split(",")]:
            bound = t_star(size=size, chunk=args.chunk, nodes=nodes, origin_bps=args.origin_bps, node_bps=args.node_bps)
            for method in args.methods.split(","):
                try:
                    result = one_method(method, args, nodes=nodes, model=model, torrent=torrent)
                except (RuntimeError, TimeoutError) as exc:  # one method failing must not end the run
                    failures += 1
                    rows.append({"nodes": nodes, "method": method, "bound": bound, "size": size, "error": str(exc)})
                    print(f"{nodes:>3} {method:<11} FAILED: {str(exc)[-600:]}", flush=True)
                    continue
                row = {"nodes": nodes, "method": method, "bound": bound, "size": size, **result}
                rows.append(row)
                print(f"{nodes:>3} {method:<11} {result['seconds']:>8.2f} {bound:>8.2f} "
                      f"{result['seconds'] / bound:>6.3f} {result['origin_link_bytes'] / size:>8.3f} "
                      f"{result['ok']}", flush=True)  # fmt: skip
                if method == "ringseed":
                    print(f"    ringseed: origin done at {result['origin_done']} s, first node complete at "
                          f"{result['first_complete']} s (master status, polled every ~0.1 s); master+agents used "
                          f"{result['cpu_seconds']:.1f} CPU-s = {result['cpu_seconds'] / result['seconds']:.2f} cores "
                          f"of {os.cpu_count()}")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
