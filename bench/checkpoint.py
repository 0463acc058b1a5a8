"""Checkpoints on the netns testbed: ringseed's node cache vs torch.save to local disk vs DCP to S3, same run.

    sudo .venv/bin/python -m bench.checkpoint --size 1Gi --node-rate 1gbit --sink-rate 100mbit \\
        [--no-dcp-save] [--no-dcp-load] [--json OUT]

Hosts: ``origin`` (a moto S3 server, the sink, and the two cache master replicas) behind a
``--sink-rate`` link, and three nodes behind ``--node-rate`` links (both directions shaped with
tc tbf). Each node runs a cache agent (memory tier in /dev/shm, sink ``s3://ckpt/ringseed``); the
training process runs on node0 (``bench/checkpoint_worker.py``) with a seeded float32 state dict.

Printed, side by side in one run:
- stall of the training loop per method (call to return): a copy of the state dict into fresh
  memory (the bound: target stall <= 1.5 x this), into warm buffers, ``torch.save`` to local disk
  (page cache; and with fsync), DCP with fsspec's S3 writer through the sink's link, ringseed's
  async save (and its acknowledgement: held on 2 nodes), ringseed's synchronous path;
- persisting behind: seconds from the acknowledgement until the sink holds it, beside S / sink rate;
- restore after node0 is lost (agent SIGKILLed, its tiers wiped): node2 from node1 (peers), beside
  S / node rate (target >= 0.8 of the link); then with node1 lost too, node2 from the sink, and
  DCP's fsspec reader from S3 (target: peers >= 5 x faster than the sink).
Rates are nominal link rates (tbf counts layer-2 bytes; MTU 9000 leaves about 99% to TCP).
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import testbed_common as common
from ringseed.protocol import units
from ringseed.testbed import links, netns

MASTER_PORTS = (8470, 8480)
AGENT_PORT, S3_PORT = 8473, 5000
BUCKET = "ckpt"


class Bench:
    """The testbed's processes for one run."""

    def __init__(self, tb: netns.Testbed, *, work: Path, size: int, chunk: int) -> None:
        self.tb, self.work, self.size, self.chunk = tb, work, size, chunk
        self.token = secrets.token_hex(16)
        self.s3 = f"http://{tb.origin.address}:{S3_PORT}"
        self.aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": self.s3}  # fmt: skip
        self.env = {"RINGSEED_TOKEN": self.token, **self.aws}
        self.masters = [f"http://{tb.origin.address}:{port}" for port in MASTER_PORTS]
        self.agents: dict[str, subprocess.Popen[Any]] = {}
        self.procs: list[subprocess.Popen[Any]] = []
        self.shm = Path(tempfile.mkdtemp(prefix="ringseed-bench-", dir="/dev/shm"))
        self.sockets = Path(tempfile.mkdtemp(prefix="rsb-"))

    def start(self) -> None:
        origin = self.tb.origin
        moto = [common.PY, "-m", "moto.server", "-H", origin.address, "-p", str(S3_PORT)]
        self.procs.append(common.spawn(origin, moto, log=self.work / "logs/moto.log", env=self.env))
        _wait_http(origin, f"{self.s3}/", what="moto")
        make = f"import boto3; boto3.client('s3').create_bucket(Bucket='{BUCKET}')"
        origin.run(["env", *(f"{k}={v}" for k, v in self.aws.items()), common.PY, "-c", make])
        for index, port in enumerate(MASTER_PORTS):
            argv = [common.PY, "-m", "ringseed.cli", "master", "--role", "cache", "--host", origin.address,
                    "--port", str(port), "--advertise-url", self.masters[index], "--lock-dir", str(self.work / "lock"),
                    "--replicas", "2", "--sink", f"s3://{BUCKET}/ringseed", "--heartbeat-interval", "0.5",
                    "--offline-after", "3"]  # fmt: skip
            self.procs.append(common.spawn(origin, argv, log=self.work / f"logs/master-{index}.log", env=self.env))
        for host in self.tb.nodes:
            self.start_agent(host)

    def socket(self, host: netns.Host) -> str:
        return str(self.sockets / f"{host.name}.sock")

    def start_agent(self, host: netns.Host) -> None:
        argv = [common.PY, "-m", "ringseed.cli", "agent", "--role", "cache", "--master-url", ",".join(self.masters),
                "--node-name", host.name, "--advertise-host", host.address, "--host", host.address,
                "--port", str(AGENT_PORT), "--socket", self.socket(host), "--memory-dir", str(self.shm / host.name),
                "--memory-bytes", str(3 * self.size), "--chunk-size", str(self.chunk),
                "--sink", f"s3://{BUCKET}/ringseed"]  # fmt: skip
        self.agents[host.name] = common.spawn(host, argv, log=self.work / f"logs/{host.name}.log", env=self.env)

    def lose(self, host: netns.Host) -> None:
        """The node is lost: its agent SIGKILLed, its memory tier gone."""
        proc = self.agents.pop(host.name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        shutil.rmtree(self.shm / host.name, ignore_errors=True)

    def leader_status(self) -> dict[str, Any]:
        for url in self.masters:
            status = common.curl_json(self.tb.origin, f"{url}/v1/status", token=self.token)
            if status and status.get("leading"):
                return dict(status)
        return {}

    def wait_ready(self, names: list[str], *, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.leader_status()
            if set(names) <= set(status.get("nodes", [])) and status.get("follower_in_sync"):
                return
            time.sleep(0.3)
        raise TimeoutError(f"cache not ready: {self.leader_status()}")

    def worker(self, host: netns.Host, step: str, *extra: str, timeout: float = 1800.0) -> dict[str, Any]:
        env = {**self.env, "RINGSEED_CACHE_SOCKET": self.socket(host)}
        argv = [common.PY, "-m", "bench.checkpoint_worker", step, "--size", str(self.size), *extra]
        proc = common.spawn(host, argv, log=self.work / f"logs/worker-{step}.log", env=env)
        line = common.read_line(proc, timeout=timeout, what=f"worker {step}")
        proc.wait(30)
        return dict(json.loads(line))

    def close(self) -> None:
        for proc in [*self.agents.values(), *self.procs]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.agents.values(), *self.procs]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.shm, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


def _wait_http(host: netns.Host, url: str, *, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = host.command(["curl", "-sf", "-o", "/dev/null", "--max-time", "2", url])
        if subprocess.run(probe, check=False, capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} at {url} did not answer")


def run(args: argparse.Namespace) -> dict[str, Any]:
    size, chunk = units.parse_size(args.size), units.parse_size(args.chunk_size)
    node_rate, sink_rate = links.parse_rate(args.node_rate), links.parse_rate(args.sink_rate)
    work = Path(tempfile.mkdtemp(prefix="ringseed-bench-checkpoint-"))
    with netns.Testbed(nodes=3, origin_rate=sink_rate, node_rate=node_rate) as tb:
        bench = Bench(tb, work=work, size=size, chunk=chunk)
        try:
            bench.start()
            node0, node1, node2 = tb.nodes
            bench.wait_ready([h.name for h in tb.nodes])
            dcp_save = ["--dcp", f"s3://{BUCKET}/dcp"] if args.dcp_save else []
            save = bench.worker(node0, "save", "--local-dir", str(work), *dcp_save)
            acked = time.monotonic()
            persisted = _wait_persisted(bench, timeout=args.timeout)
            persist_s = time.monotonic() - acked if persisted else None
            bench.lose(node0)
            from_peers = bench.worker(node2, "restore")
            bench.lose(node1)
            bench.lose(node2)
            bench.start_agent(node2)
            bench.wait_ready([node2.name])
            from_sink = bench.worker(node2, "restore")
            dcp_load = (
                bench.worker(node2, "dcp-load", "--dcp", f"s3://{BUCKET}/dcp")
                if args.dcp_load and args.dcp_save
                else None
            )
        finally:
            bench.close()
    return {"size": size, "chunk": chunk, "node_rate": node_rate, "sink_rate": sink_rate, "save": save,
            "persist_s": persist_s, "from_peers": from_peers, "from_sink": from_sink, "dcp_load": dcp_load,
            "work": str(work)}  # fmt: skip


def _wait_persisted(bench: Bench, *, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = bench.leader_status().get("last_checkpoint") or {}
        if last.get("persisted"):
            return True
        time.sleep(0.5)
    return False


def report(result: dict[str, Any]) -> None:
    s, save = result["size"], result["save"]
    node_link, sink_link = result["node_rate"] / 8, result["sink_rate"] / 8
    fresh = save["copy_fresh_s"]
    print(f"state dict {s / (1 << 20):.0f} MiB; links: nodes {result['node_rate'] / 1e9:.2f} Gbit/s, "
          f"sink {result['sink_rate'] / 1e6:.0f} Mbit/s; chunk {result['chunk'] >> 20} MiB")  # fmt: skip
    print(f"\n{'stall (save call to return)':<44} {'seconds':>9} {'x fresh copy':>13}")
    rows = [
        ("copy into fresh memory (bound: target <= 1.5x)", fresh),
        ("copy into warm buffers", save["copy_reused_s"]),
        ("torch.save to local disk (page cache)", save["torch_save_s"]),
        ("torch.save to local disk + fsync", save["torch_save_fsync_s"]),
        ("DCP fsspec writer to S3 (sink link)", save.get("dcp_s3_s")),
        ("ringseed async save: stall, first save", save.get("ringseed_first_stall_s")),
        ("ringseed async save: stall, later saves", save["ringseed_stall_s"]),
        ("ringseed async save: acknowledged (2 copies)", save["ringseed_ack_s"]),
        ("ringseed torch.save(fs.open()) + close", save["ringseed_sync_s"]),
    ]
    for label, seconds in rows:
        if seconds is not None:
            print(f"{label:<44} {seconds:>9.3f} {seconds / fresh:>13.2f}")
    persist = result["persist_s"]
    bound = s / sink_link
    persist_text = (
        f"{persist:.1f} s (S/sink {bound:.1f} s, {bound / persist:.2f} of the link)" if persist else "not done"
    )
    print(f"\npersisted behind to S3 after the ack: {persist_text}")
    peers, sink, dcp = result["from_peers"], result["from_sink"], result["dcp_load"]
    print(f"\n{'restore after losing the writer node':<44} {'seconds':>9} {'MB/s':>8} {'of link':>8} {'ok':>4}")
    restores = [
        ("from a peer (replica on node1)", peers["restore_s"], node_link, peers["ok"]),
        ("from the sink (S3), ringseed", sink["restore_s"], sink_link, sink["ok"]),
    ]
    if dcp:
        restores.append(("DCP fsspec reader from S3", dcp["dcp_load_s"], sink_link, dcp["ok"]))
    for label, seconds, link, ok in restores:
        rate = s / seconds
        print(f"{label:<44} {seconds:>9.3f} {rate / 1e6:>8.1f} {rate / link:>8.3f} {'yes' if ok else 'NO':>4}")
    print(f"  torch.load from the local copy after the restore: {peers['load_s']:.3f} s")
    print(f"\ntargets: stall {save['ringseed_stall_s'] / fresh:.2f} x fresh copy (<= 1.5); restore from peers "
          f"{s / peers['restore_s'] / node_link:.2f} of the node link (>= 0.8); peers vs sink "
          f"{sink['restore_s'] / peers['restore_s']:.1f} x (>= 5)"
          + (f", vs DCP from S3 {dcp['dcp_load_s'] / peers['restore_s']:.1f} x" if dcp else ""))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1Gi", help="state dict bytes")
    parser.add_argument("--chunk-size", default="32Mi")
    parser.add_argument("--node-rate", default="1gbit")
    parser.add_argument("--sink-rate", default="100mbit")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--dcp-load", action=argparse.BooleanOptionalAction, default=True, help="also time DCP's reader from S3"
    )
    parser.add_argument(
        "--dcp-save",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time DCP's writer to S3 (--no-dcp-save: a quicker run for the ringseed rows and the restores)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    reason = netns.can_run()
    if reason:
        print(f"checkpoint bench: {reason}")
        return 1
    result = run(args)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if result["from_peers"]["ok"] and result["from_sink"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
