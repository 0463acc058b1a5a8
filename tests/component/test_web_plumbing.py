"""Shared HTTP plumbing (ringseed.web): JSON errors keep the headers a client needs."""

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ringseed import web as rweb


async def test_headers_kept_and_401_challenge() -> None:
    app = rweb.make_app(token="t")

    async def busy(request: web.Request) -> web.Response:
        raise web.HTTPTooManyRequests(headers={"Retry-After": "1"})

    app.router.add_get("/busy", busy)
    async with TestClient(TestServer(app)) as c:
        r = await c.get("/busy", headers={"Authorization": "Bearer t"})
        assert r.status == 429 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"] == "too_many_requests"
        r = await c.get("/busy")
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert "token" in (await r.json())["reason"]
