"""A lying peer for the fault tests: ``python -m tests.component.distribution.lying_agent agent ...``.

A real agent process (``ringseed.cli``) whose chunk server flips the middle byte of every whole
chunk it serves, under the true hash header, and never streams chunks in flight. The fault lives
here, in the tests, not behind a switch in the production agent.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web as aioweb

from ringseed import cli
from ringseed.agent import server


def flip_middle(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` with its middle byte flipped."""
    raw = bytearray(data)
    raw[len(raw) // 2] ^= 0xFF
    return bytes(raw)


async def _send_flipped(self: server._ChunkServer, request: aioweb.Request, index: int) -> aioweb.StreamResponse:
    data = self.source.memory.get(index)
    if data is None:
        data = await asyncio.to_thread(self.source.store.read_chunk, index)
    headers = {"X-Chunk-Sha256": self.source.held[index]}
    return await self._send_memory(request, flip_middle(data), headers)


async def _never_stream(self: server._ChunkServer, request: aioweb.Request, inflight: object) -> aioweb.StreamResponse:
    return server._busy("this test peer does not stream")


def main() -> int:
    server._ChunkServer._send = _send_flipped  # type: ignore[method-assign]
    server._ChunkServer._stream = _never_stream  # type: ignore[method-assign,assignment]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
