"""libtorrent baseline: one seed on the origin host, N peers meshed with ``connect_peer``, no tracker.

What a user might pick instead of ringseed: BitTorrent. DHT, LSD, UPnP and NAT-PMP are off, so
peers know each other only through ``connect_peer``; the piece size is libtorrent's default.

    python -m bench.baselines.torrent make DIR OUT.torrent [--version hybrid|v1|v2]
    python -m bench.baselines.torrent seed OUT.torrent DIR --listen 10.77.0.1:6881 --gate G --stop S
    python -m bench.baselines.torrent peer OUT.torrent SAVE --listen 10.77.1.1:6881 \
        --connect 10.77.0.1:6881,10.77.1.2:6881 --gate G --stop S --node n0

Each ``seed``/``peer`` prints ``READY`` once its torrent is loaded (the seed: checked), waits for
the gate file, connects, and a peer prints one JSON line ``{"node", "bytes", "start", "end"}``
when it holds every piece; both keep seeding until the stop file exists, then print one JSON line
``{"node", "uploaded", "downloaded"}`` (payload bytes this process sent and received).

``make`` writes libtorrent's default torrent (hybrid: v1 SHA-1 pieces and v2 SHA-256 trees, both
checked by a downloader) unless ``--version`` asks for v1 or v2 only. Several processes may share
one address (``allow_multiple_connections_per_ip``), so a swarm can run on loopback.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import libtorrent as lt

VERSION_FLAGS = {"hybrid": 0, "v1": lt.create_torrent.v1_only, "v2": lt.create_torrent.v2_only}


def make(directory: Path, out: Path, *, version: str = "hybrid") -> None:
    storage = lt.file_storage()
    lt.add_files(storage, str(directory))
    torrent = lt.create_torrent(storage, 0, VERSION_FLAGS[version])
    lt.set_piece_hashes(torrent, str(directory.parent))
    out.write_bytes(lt.bencode(torrent.generate()))


def session(listen: str) -> Any:
    return lt.session(
        {
            "listen_interfaces": listen,
            "enable_dht": False,
            "enable_lsd": False,
            "enable_upnp": False,
            "enable_natpmp": False,
            "alert_mask": 0,
            "connections_limit": 500,
            "allow_multiple_connections_per_ip": True,
        }
    )


def wait_file(path: Path | None) -> None:
    while path is not None and not path.exists():
        time.sleep(0.01)


def add(ses: Any, torrent: Path, save: Path) -> Any:
    params = lt.add_torrent_params()
    params.ti = lt.torrent_info(str(torrent))
    params.save_path = str(save)
    return ses.add_torrent(params)


def connect(handle: Any, peers: str) -> None:
    for item in filter(None, peers.split(",")):
        host, port = item.rsplit(":", 1)
        handle.connect_peer((host, int(port)))


def run(args: argparse.Namespace) -> None:
    ses = session(args.listen)
    handle = add(ses, args.torrent, args.save)
    if args.role == "seed":
        while not handle.status().is_seeding:
            time.sleep(0.05)
    print("READY", flush=True)
    wait_file(args.gate)
    start = time.time()
    connect(handle, args.connect)
    if args.role == "peer":
        last = start
        while not handle.status().is_seeding:
            time.sleep(0.02)
            if time.time() - last > 2.0:
                last = time.time()
                connect(handle, args.connect)  # peers that were not listening yet
        size = handle.status().total_wanted
        print(json.dumps({"node": args.node, "bytes": size, "start": start, "end": time.time()}), flush=True)
    wait_file(args.stop)
    status = handle.status()
    totals = {"node": args.node, "uploaded": status.total_payload_upload, "downloaded": status.total_payload_download}
    print(json.dumps(totals), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    maker = sub.add_parser("make")
    maker.add_argument("directory", type=Path)
    maker.add_argument("out", type=Path)
    maker.add_argument("--version", choices=sorted(VERSION_FLAGS), default="hybrid")
    for role in ("seed", "peer"):
        p = sub.add_parser(role)
        p.add_argument("torrent", type=Path)
        p.add_argument("save", type=Path, help="seed: the model directory's parent; peer: where to write")
        p.add_argument("--listen", required=True)
        p.add_argument("--connect", default="")
        p.add_argument("--gate", type=Path, default=None)
        p.add_argument("--stop", type=Path, default=None)
        p.add_argument("--node", default=role)
    args = parser.parse_args()
    if args.role == "make":
        make(args.directory, args.out, version=args.version)
    else:
        run(args)


if __name__ == "__main__":
    main()
