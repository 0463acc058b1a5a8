"""Datasets on the netns testbed: ringseed's read-through cache vs each node reading S3 vs fsspec's file cache.

    sudo .venv/bin/python -m bench.datasets --nodes 4 --size 1Gi --origin-rate 100mbit --node-rate 1gbit \\
        [--layouts large,small] [--small-files 10000] [--methods ringseed,fuse,direct,simplecache,local] [--json OUT]

Hosts: ``origin`` (a moto S3 server holding the dataset, and ringseed's cache masters) behind
``--origin-rate``, N nodes behind ``--node-rate``. For each layout (``large``: 8 files; ``small``:
``--small-files`` files of equal size) and method, every node reads every file in listing order for
two epochs, all nodes starting at one gate. Methods:
- ``ringseed``: ``ringseed://data/ds`` through the node's cache agent (peers first, the source once);
- ``fuse``: the same through ``ringseed mount --root data`` (plain files; epoch 2 from the page cache);
- ``direct``: fsspec's s3fs straight from S3 on every node (no cache: epoch 2 pays again);
- ``simplecache``: ``simplecache::s3://`` (fsspec's whole-file local cache, per node);
- ``local``: the same files from the node's local disk (copied there first; page cache warm): the
  epoch-2 bound.
Printed per method: epoch 1 and epoch 2 seconds (slowest node), origin bytes / dataset size (layer
2 bytes the origin's link sent, so ``direct`` at N nodes shows about N), for the cache the dataset
bytes its agents read from the source / dataset size (their counters: 1.0 means each byte read
once; the rest of the origin's bytes is requests, listings, the master's answers and framing),
and epoch-2 throughput as a share of ``local``. Targets: ringseed's origin bytes <= 1.05 x the
dataset; epoch 2 >= 0.8 of local.
"""

from __future__ import annotations

import argparse
import json
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

MASTER_PORT, AGENT_PORT, S3_PORT = 8470, 8473, 5000
BUCKET = "datasets"


def write_dataset(root: Path, *, layout: str, size: int, small_files: int) -> Path:
    target = root / layout
    if target.exists():
        return target
    count = 8 if layout == "large" else small_files
    each = size // count
    import numpy as np

    rng = np.random.default_rng(11)
    for i in range(count):
        path = target / (f"shard-{i:03d}.bin" if layout == "large" else f"{i // 1000:03d}/{i:06d}.jpg")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.integers(0, 256, size=each, dtype=np.uint8).tobytes())
    return target


class Bench:
    def __init__(self, tb: netns.Testbed, *, work: Path, chunk: int, memory: int) -> None:
        self.tb, self.work, self.chunk, self.memory = tb, work, chunk, memory
        self.token = secrets.token_hex(16)
        self.s3 = f"http://{tb.origin.address}:{S3_PORT}"
        self.aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": self.s3}  # fmt: skip
        self.env = {"RINGSEED_TOKEN": self.token, **self.aws}
        self.procs: list[subprocess.Popen[Any]] = []
        self.shm = Path(tempfile.mkdtemp(prefix="ringseed-bench-data-", dir="/dev/shm"))
        self.sockets = Path(tempfile.mkdtemp(prefix="rsd-"))

    def start_s3(self, datasets: dict[str, Path]) -> None:
        origin = self.tb.origin
        moto = [common.PY, "-m", "moto.server", "-H", origin.address, "-p", str(S3_PORT)]
        self.procs.append(common.spawn(origin, moto, log=self.work / "logs/moto.log", env=self.env))
        deadline = time.monotonic() + 60
        while subprocess.run(origin.command(["curl", "-sf", "-o", "/dev/null", f"{self.s3}/"]),
                             check=False, capture_output=True).returncode:  # fmt: skip
            assert time.monotonic() < deadline, "moto did not start"
            time.sleep(0.3)
        upload = (
            "import boto3, os, sys\n"
            "s3 = boto3.client('s3')\n"
            f"s3.create_bucket(Bucket='{BUCKET}')\n"
            "for prefix, root in zip(sys.argv[1::2], sys.argv[2::2]):\n"
            "    for d, _, names in os.walk(root):\n"
            "        for n in names:\n"
            "            p = os.path.join(d, n)\n"
            "            s3.upload_file(p, '" + BUCKET + "', prefix + '/' + os.path.relpath(p, root))\n"
        )
        argv = [common.PY, "-c", upload]
        for name, root in datasets.items():
            argv += [name, str(root)]
        origin.run(["env", *(f"{k}={v}" for k, v in self.aws.items()), *argv], timeout=3600)

    def start_cache(self, layout: str) -> list[subprocess.Popen[Any]]:
        origin = self.tb.origin
        master_url = f"http://{origin.address}:{MASTER_PORT}"
        procs = [common.spawn(origin, [common.PY, "-m", "ringseed.cli", "master", "--role", "cache", "--host",
                              origin.address, "--port", str(MASTER_PORT), "--advertise-url", master_url,
                              "--lock-dir", str(self.work / f"lock-{layout}"), "--replicas", "1",
                              "--heartbeat-interval", "0.5"],
                              log=self.work / f"logs/master-{layout}.log", env=self.env)]  # fmt: skip
        for host in self.tb.nodes:
            argv = [common.PY, "-m", "ringseed.cli", "agent", "--role", "cache", "--master-url", master_url,
                    "--node-name", host.name, "--advertise-host", host.address, "--host", host.address,
                    "--port", str(AGENT_PORT), "--socket", str(self.sockets / f"{layout}-{host.name}.sock"),
                    "--memory-dir", str(self.shm / layout / host.name), "--memory-bytes", str(self.memory),
                    "--chunk-size", str(self.chunk), "--data", f"ds=s3://{BUCKET}/{layout}"]  # fmt: skip
            procs.append(common.spawn(host, argv, log=self.work / f"logs/{layout}-{host.name}.log", env=self.env))
        deadline = time.monotonic() + 120
        while True:
            status = common.curl_json(origin, f"{master_url}/v1/status", token=self.token) or {}
            if len(status.get("nodes", [])) == len(self.tb.nodes):
                return procs
            assert time.monotonic() < deadline, f"cache agents did not register: {status}"
            time.sleep(0.3)

    def mount(self, host: netns.Host, layout: str, env: dict[str, str]) -> tuple[subprocess.Popen[Any], Path]:
        """``ringseed mount --root data`` of the node's cache; here, not in the node's namespace: the
        mount reaches its agent over the Unix socket and a mount made inside ``ip netns exec`` is
        seen only there."""
        point = self.work / "mnt" / layout / host.name
        point.mkdir(parents=True, exist_ok=True)
        argv = [common.PY, "-m", "ringseed.cli", "mount", str(point), "--root", "data"]
        proc = common.spawn(None, argv, log=self.work / f"logs/mount-{layout}-{host.name}.log", env=env)
        deadline = time.monotonic() + 60
        while not os.path.ismount(point):
            assert proc.poll() is None and time.monotonic() < deadline, f"mount at {point} did not appear"
            time.sleep(0.1)
        return proc, point

    def read(self, method: str, layout: str, source: Path) -> dict[str, Any]:
        gate = self.work / f"gate-{method}-{layout}"
        gate.unlink(missing_ok=True)
        cache = self.start_cache(layout) if method in ("ringseed", "fuse") else []
        readers, mounts = [], []
        for host in self.tb.nodes:
            env = dict(self.env, RINGSEED_CACHE_SOCKET=str(self.sockets / f"{layout}-{host.name}.sock"))
            where: netns.Host | None = host
            if method == "fuse":
                proc, point = self.mount(host, layout, env)
                mounts.append((proc, point))
                where = None  # with its mount
            url = {
                "ringseed": "ringseed://data/ds",
                "fuse": str(self.work / "mnt" / layout / host.name / "ds"),
                "direct": f"s3://{BUCKET}/{layout}",
                "simplecache": f"simplecache::s3://{BUCKET}/{layout}",
                "local": str(self._local_copy(host, layout, source)),
            }[method]
            cache_dir = self.work / "fsspec-cache" / layout / host.name
            argv = [common.PY, "-m", "bench.datasets_worker", url, "--epochs", "2", "--gate", str(gate),
                    "--s3-endpoint", self.s3, "--cache-dir", str(cache_dir)]  # fmt: skip
            log = self.work / f"logs/{method}-{layout}-{host.name}.log"
            readers.append(common.spawn(where, argv, log=log, env=env))
        time.sleep(1.0)  # the readers import fsspec and wait at the gate
        before = common.sent_bytes(self.tb.origin)
        common.gate(gate)
        results = [json.loads(common.read_line(p, timeout=7200, what=f"{method} reader")) for p in readers]
        origin_bytes = common.sent_bytes(self.tb.origin) - before
        source_payload = self._source_payload() if cache else None
        for _, point in mounts:
            subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
        for proc in [*readers, *(m for m, _ in mounts), *cache]:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(self.shm / layout, ignore_errors=True)
        return {"method": method, "layout": layout, "files": results[0]["files"], "bytes": results[0]["bytes"],
                "epoch1": max(r["epochs"][0] for r in results), "epoch2": max(r["epochs"][1] for r in results),
                "origin_bytes": origin_bytes, "source_payload": source_payload}  # fmt: skip

    def _source_payload(self) -> int:
        """Dataset bytes the agents read from the source (their counters): repeated reads show here,
        request, listing and framing overhead only in the origin link's bytes."""
        total = 0
        for host in self.tb.nodes:
            status = common.curl_json(host, f"http://{host.address}:{AGENT_PORT}/v1/status", token=self.token) or {}
            total += int(status.get("data", {}).get("counters", {}).get("bytes_from_source", 0))
        return total

    def _local_copy(self, host: netns.Host, layout: str, source: Path) -> Path:
        target = self.work / "local" / host.name / layout
        if not target.exists():
            shutil.copytree(source, target)
        return target

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(self.shm, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--size", default="1Gi")
    parser.add_argument("--small-files", type=int, default=10_000)
    parser.add_argument("--layouts", default="large,small")
    parser.add_argument("--methods", default="ringseed,fuse,direct,simplecache,local")
    parser.add_argument("--origin-rate", default="100mbit")
    parser.add_argument("--node-rate", default="1gbit")
    parser.add_argument("--chunk-size", default="32Mi")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reason = netns.can_run()
    if reason:
        print(f"datasets bench: {reason}")
        return 1
    size = units.parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="ringseed-bench-datasets-"))
    layouts = args.layouts.split(",")
    sources = {
        name: write_dataset(work / "src", layout=name, size=size, small_files=args.small_files) for name in layouts
    }
    rows: list[dict[str, Any]] = []
    with netns.Testbed(nodes=args.nodes, origin_rate=links.parse_rate(args.origin_rate),
                       node_rate=links.parse_rate(args.node_rate)) as tb:  # fmt: skip
        bench = Bench(tb, work=work, chunk=units.parse_size(args.chunk_size), memory=2 * size)
        try:
            bench.start_s3(sources)
            for layout in layouts:
                for method in args.methods.split(","):
                    row = bench.read(method, layout, sources[layout])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            try:
                bench.close()
            finally:
                for point in (work / "mnt").glob("*/*"):  # a run cut short may leave mounts
                    subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
                for bulky in ("src", "local", "fsspec-cache", "mnt"):  # gigabytes per run; the logs stay
                    shutil.rmtree(work / bulky, ignore_errors=True)
    report(rows, nodes=args.nodes, origin_rate=links.parse_rate(args.origin_rate))
    print(f"logs: {work / 'logs'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def report(rows: list[dict[str, Any]], *, nodes: int, origin_rate: float) -> None:
    print(f"\nN = {nodes} nodes, origin link {origin_rate / 1e6:.0f} Mbit/s; seconds are the slowest node's")
    print(f"{'layout':<7} {'method':<12} {'files':>6} {'MiB':>6} {'epoch 1 s':>10} {'epoch 2 s':>10} "
          f"{'origin/S':>9} {'source/S':>9} {'ep2 vs local':>13}")  # fmt: skip
    local = {r["layout"]: r["epoch2"] for r in rows if r["method"] == "local"}
    for row in rows:
        share = local.get(row["layout"])
        versus = f"{share / row['epoch2']:>13.2f}" if share else f"{'-':>13}"
        origin = row["origin_bytes"] / row["bytes"]
        payload = (
            f"{row['source_payload'] / row['bytes']:>9.3f}" if row.get("source_payload") is not None else f"{'-':>9}"
        )
        print(f"{row['layout']:<7} {row['method']:<12} {row['files']:>6} {row['bytes'] / (1 << 20):>6.0f} "
              f"{row['epoch1']:>10.2f} {row['epoch2']:>10.2f} {origin:>9.3f} {payload} {versus}")  # fmt: skip
    for layout in sorted({r["layout"] for r in rows}):
        bound = next(r["bytes"] for r in rows if r["layout"] == layout) / (origin_rate / 8)
        print(f"{layout}: S / origin rate = {bound:.1f} s (epoch 1 bound for the whole cluster)")


if __name__ == "__main__":
    raise SystemExit(main())
