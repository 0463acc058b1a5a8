"""An aiohttp application served on a loopback port from a background thread, for sync tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web as aioweb


@contextlib.contextmanager
def in_thread(app: aioweb.Application) -> Iterator[str]:
    """Yield the base URL of ``app`` served on 127.0.0.1 from its own thread and loop; stop it afterwards."""
    loop = asyncio.new_event_loop()
    runner = aioweb.AppRunner(app, access_log=None)
    ready: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def start() -> None:
        await runner.setup()
        site = aioweb.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.set_result(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    try:
        yield f"http://127.0.0.1:{ready.result(10)}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
