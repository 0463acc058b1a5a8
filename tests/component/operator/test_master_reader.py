"""The operator's reader of master status follows a replicated master's leader."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web as aioweb

from ringseed import web
from ringseed.operator import masters
from tests.component import served


def _leader(answers: list[str]) -> aioweb.Application:
    async def status(request: aioweb.Request) -> aioweb.Response:
        answers.append(request.headers.get("Authorization", ""))
        return aioweb.json_response({"role": "tracker", "nodes_total": 3})

    app = aioweb.Application()
    app.router.add_get("/v1/status", status)
    return app


def _follower(leader_url: str | None) -> aioweb.Application:
    async def status(request: aioweb.Request) -> aioweb.Response:
        raise web.problem(
            503,
            "not_leader",
            "this tracker replica follows",
            headers={web.LEADER_HEADER: leader_url} if leader_url else None,
        )

    app = aioweb.Application()
    app.router.add_get("/v1/status", status)
    return app


async def test_a_follower_s_answer_is_followed_to_the_leader_it_names() -> None:
    answers: list[str] = []
    with served.in_thread(_leader(answers)) as leader, served.in_thread(_follower(leader)) as follower:
        reader = masters.Reader()
        try:
            body: dict[str, Any] = await reader.status(url=follower, token="t0k")
        finally:
            await reader.close()
    assert body == {"role": "tracker", "nodes_total": 3}
    assert answers == ["Bearer t0k"]


async def test_a_follower_that_names_no_leader_is_a_master_error_saying_so() -> None:
    with served.in_thread(_follower(None)) as follower:
        reader = masters.Reader()
        try:
            with pytest.raises(masters.MasterError, match="503: this tracker replica follows"):
                await reader.status(url=follower, token=None)
        finally:
            await reader.close()
