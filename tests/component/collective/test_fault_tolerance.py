"""A peer process killed with SIGKILL during all-reduces: survivors abort, restore, and retry.

Runs ``ringseed local allreduce --kill-peer-at`` (coordinator and peers are real processes);
the peers all-reduce in a loop, so the kill lands during an operation.
"""

from __future__ import annotations

import json
import subprocess


def test_sigkill_mid_all_reduce_recovers_with_the_survivors(ringseed_cmd: list[str]) -> None:
    timeout = 2.0
    done = subprocess.run(
        [*ringseed_cmd, "local", "allreduce", "--peers", "3", "--size", "8Mi", "--kill-peer-at", "0.5",
         "--heartbeat-interval", "0.25", "--heartbeat-timeout", str(timeout), "--iters", "1", "--json"],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    # every survivor's call ended in an abort, within the heartbeat timeout of the kill
    assert summary["abort_seconds"] is not None and summary["abort_seconds"] <= timeout
    # ... with its buffer bit-identical to before the call
    assert summary["restored_bit_for_bit"] is True
    # the retry ran on the survivors and equals the reduction over the survivors
    assert summary["world_size"] == 2 and summary["survivors"] == ["peer-0", "peer-1"]
    assert summary["retry_max_abs_error"] <= summary["tolerance"]
    # recovery: the failure detector's timeout plus a little (generous for loaded machines)
    assert summary["recovery_seconds"] <= timeout + 3.0
    assert summary["ok"] is True
