"""Run a command to completion from the harness's event loop, never leaving it behind.

The emulator, the kubelets and the operator's traffic share one event loop, so the harness runs
``podman`` and ``kubectl`` asynchronously. A command that times out, or whose caller is cancelled
(a kubelet stopped at teardown), is killed and reaped here: an unreaped child keeps its asyncio
transport open past the loop's end, and its finaliser then runs at an arbitrary later point of the
test process (garbage collection during another thread's work).
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


class ProcessTimeout(TimeoutError):
    pass


@dataclass(frozen=True)
class Finished:
    returncode: int
    out: bytes
    err: bytes


async def run_process(
    *args: str,
    within: float,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    merge_stderr: bool = False,
) -> Finished:
    """``args`` run to exit within ``within`` seconds (stderr folded into ``out`` with ``merge_stderr``)."""
    process = await asyncio.create_subprocess_exec(
        *args,
        env=dict(env) if env is not None else None,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(within):
            out, err = await process.communicate(stdin)
    except TimeoutError:
        raise ProcessTimeout(f"{' '.join(args[:4])}... did not exit within {within} s") from None
    finally:
        if process.returncode is None:  # timed out or cancelled: kill it and reap it, shielded from the cancel
            process.kill()
            await asyncio.shield(process.wait())
    assert process.returncode is not None
    return Finished(process.returncode, out, err or b"")
