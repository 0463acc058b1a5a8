"""A peer that stalls once, mid-chunk: ``python -m tests.component.distribution.stalling_agent agent ...``.

A real agent process (``ringseed.cli``) whose chunk server, on the first chunk it is asked for,
sends the head and the first half of the body, writes ``<index>`` into the file that
``RINGSEED_TEST_STALL`` names and then sends nothing more, holding the connection (and one upload
slot) open; every other request is served as usual. The receiver is then mid-receive for as long
as the test wants (its read timeout is 30 s). The fault lives here, in the tests.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from aiohttp import web as aioweb

from ringseed import cli
from ringseed.agent import server

_serve = server._ChunkServer._send
_stalled: list[int] = []


async def _stall_once(self: server._ChunkServer, request: aioweb.Request, index: int) -> aioweb.StreamResponse:
    if _stalled:  # checked and set with no await between: one request stalls, not every concurrent one
        return await _serve(self, request, index)
    _stalled.append(index)
    marker = Path(os.environ["RINGSEED_TEST_STALL"])
    data = self.source.memory.get(index)
    if data is None:
        data = await asyncio.to_thread(self.source.store.read_chunk, index)
    response = aioweb.StreamResponse(headers={"X-Chunk-Sha256": self.source.held[index]})
    response.content_type = "application/octet-stream"
    response.content_length = len(data)
    await response.prepare(request)
    await response.write(bytes(data[: len(data) // 2]))
    await asyncio.to_thread(marker.write_text, str(index))
    await asyncio.Event().wait()  # until the receiver goes away or this agent is stopped
    return response


def main() -> int:
    server._ChunkServer._send = _stall_once  # type: ignore[method-assign]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
