"""Testbed smoke test (root): shaped links, a model delivered across namespaces, one all-reduce, clean-up."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from ringseed.testbed import netns

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(netns.can_run() is not None, reason=str(netns.can_run()))]

RECEIVER = "import socket,sys;s=socket.socket();s.bind(('0.0.0.0',9000));s.listen();print('ready',flush=True)\n" \
    "c,_=s.accept()\nwhile c.recv(1<<20): pass\nprint('done')"  # fmt: skip


def send_seconds(src: netns.Host, dst: netns.Host, nbytes: int) -> float:
    sink = dst.popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"  # listening: the sender may dial
    code = (f"import socket,time;s=socket.create_connection(('{dst.address}',9000));t=time.time();"
            f"s.sendall(bytes({nbytes}));s.shutdown(1);s.recv(1);print(time.time()-t)")  # fmt: skip
    seconds = float(src.run([sys.executable, "-c", code], timeout=30))
    sink.wait(timeout=10)
    return seconds


def test_links_are_shaped_both_ways_and_everything_is_removed() -> None:
    with netns.Testbed(nodes=2, origin_rate=100e6, node_rate=1e9) as tb:
        names = [h.netns for h in tb.hosts]
        up = send_seconds(tb.origin, tb.nodes[0], 2_500_000)  # 20 Mbit at 100 Mbit/s: about 0.2 s
        down = send_seconds(tb.nodes[1], tb.origin, 2_500_000)
    assert 0.16 < up < 0.4 and 0.16 < down < 0.4
    assert not set(names) & set(netns.list_namespaces())


def test_cleanup_after_an_error_inside_the_block() -> None:
    with pytest.raises(RuntimeError), netns.Testbed(nodes=1, origin_rate=None, node_rate=None) as tb:
        names = [h.netns for h in tb.hosts] + [tb.bridge]
        tb.nodes[0].popen(["sleep", "60"])
        raise RuntimeError("boom")
    assert not set(names) & set(netns.list_namespaces())


def test_model_delivered_to_three_nodes_and_one_all_reduce(tmp_path: Path) -> None:
    from bench import allreduce, testbed_common, testbed_distribution

    model = testbed_common.write_model(tmp_path / "model", size=12 << 20, files=3)
    args = argparse.Namespace(origin_bps=200e6, node_bps=1e9, chunk=1 << 20, heartbeat=0.25, timeout=60.0,
                              workdir=str(tmp_path), keep=False, agent_args="")  # fmt: skip
    result = testbed_distribution.one_method("ringseed", args, nodes=3, model=model, torrent=tmp_path / "none")
    assert result["ok"], result
    assert result["origin_link_bytes"] < 1.3 * (12 << 20)  # the model left the origin about once
    with netns.Testbed(nodes=3, origin_rate=None, node_rate=1e9) as tb:
        seconds = allreduce.measure("ringseed", world=3, nbytes=4 << 20, iters=1, testbed=tb)  # ranks check the sum
    assert seconds > 0
