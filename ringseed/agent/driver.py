"""The agent core's driver: feeds it time and events, carries out its actions with asyncio.

Owns the tasks of running jobs. Rules:
- :func:`core_loop` ticks the core (:meth:`~ringseed.protocol.agentcore.AgentCore.tick`) after
  anything changed (``agent.changed``) and when the core's next back-off ends; the actions it
  returns start jobs, one task each.
- A job task carries out its step (:mod:`ringseed.agent.fetch` for peers, :mod:`ringseed.agent.seeder`
  for the origin, :func:`ringseed.agent.chunks.accept` to store), feeds the result to the core
  and goes on with the next step the core returns for the job; other actions returned on the
  way (a report, a problem, a job to cancel, a retake of the source) are carried out at once.
- A job whose step raised (a bug, not an I/O failure: those are results) is ended in the core
  as failed, so its slot is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from ringseed.agent import chunks, fetch, seeder, store
from ringseed.protocol import agentsteps

if TYPE_CHECKING:
    from ringseed.agent.agent import Agent

log = logging.getLogger(__name__)
IDLE_TICK_S = 1.0  # tick at least this often (a safety net; the core's wakeups are exact)

Step = (
    agentsteps.FindHolders | agentsteps.FindSource | agentsteps.Fetch | agentsteps.AwaitHash | agentsteps.Store
    | agentsteps.Pull | agentsteps.Reuse
)  # fmt: skip


async def core_loop(agent: Agent) -> None:
    core = agent.core
    while True:
        wait = min(IDLE_TICK_S, max(0.0, core.next_wakeup(now=time.monotonic()) - time.monotonic()))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(agent.changed.wait(), timeout=wait)
        agent.changed.clear()
        if core.idle:
            agent.buffers.trim()  # nothing left to fetch: give the idle chunk buffers back
        perform(agent, core.tick(now=time.monotonic()))
        if core.layout is not None and not core.downloading and not _watching(agent) and core.starved:
            _watch(agent)  # nothing to do: wait for news (a long-poll), never poll


def _watching(agent: Agent) -> bool:
    return ("watch", 0) in agent.jobs


def _watch(agent: Agent) -> None:
    task = asyncio.create_task(agent.watch(None, wait=agent.heartbeat_interval))
    agent.jobs[("watch", 0)] = task

    def done(finished: asyncio.Task[None]) -> None:
        if agent.jobs.get(("watch", 0)) is finished:
            del agent.jobs[("watch", 0)]
        agent.changed.set()

    task.add_done_callback(done)


def perform(agent: Agent, actions: list[agentsteps.Action], *, job: int | None = None) -> Step | None:
    """Carry out ``actions``; the step of job ``job`` among them is returned (the caller runs it),
    steps of other jobs start tasks."""
    mine: Step | None = None
    for action in actions:
        if isinstance(action, agentsteps.Claim):
            _spawn(agent, action, key=("claim", 0))
        elif isinstance(action, Step):
            if job is not None and action.job == job:
                mine = action
            else:
                _spawn(agent, action, key=("job", action.job))
        elif isinstance(action, agentsteps.Cancel):
            task = agent.jobs.pop(("job", action.job), None)
            if task is not None:
                task.cancel()
        elif isinstance(action, agentsteps.Report):
            _spawn(agent, action, key=("report", id(action)))
        elif isinstance(action, agentsteps.SetProblem):
            agent.problems.set(action.reason, action.message)
        elif isinstance(action, agentsteps.ClearProblem):
            agent.problems.clear(action.reason)
        elif isinstance(action, agentsteps.Retake):
            agent.revision_news.set()
    return mine


def _spawn(agent: Agent, first: Step | agentsteps.Claim | agentsteps.Report, *, key: tuple[str, int]) -> None:
    task = asyncio.create_task(_run(agent, first))
    agent.jobs[key] = task

    def done(finished: asyncio.Task[None]) -> None:
        if agent.jobs.get(key) is finished:
            del agent.jobs[key]
        agent.changed.set()

    task.add_done_callback(done)


async def _run(agent: Agent, first: Step | agentsteps.Claim | agentsteps.Report) -> None:
    if isinstance(first, agentsteps.Report):
        await fetch.report(agent, first)
        return
    if isinstance(first, agentsteps.Claim):
        perform(agent, await seeder.claim(agent, first))
        return
    step: Step | None = first
    data: Data = None
    job = first.job
    try:
        while step is not None:
            actions, data = await _step(agent, step, data)
            step = perform(agent, actions, job=job)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("Job %d (%s) failed", job, type(first).__name__)
        perform(agent, agent.core.abort(job, now=time.monotonic()))
    finally:
        if isinstance(data, store.Landing):
            data.release()  # not held (a held one was released by chunks.accept_landed)
        if isinstance(first, agentsteps.Pull):
            seeder.pulled_out(agent, first.index)


Data = memoryview | bytearray | store.Landing | None  # a job's chunk bytes between its steps


async def _step(agent: Agent, step: Step, data: Data) -> tuple[list[agentsteps.Action], Data]:
    now = time.monotonic
    if isinstance(step, agentsteps.FindHolders):
        return await fetch.find_holders(agent, step), data
    if isinstance(step, agentsteps.FindSource):
        return await fetch.find_source(agent, step), data
    if isinstance(step, agentsteps.Fetch):
        if isinstance(data, store.Landing):
            data.release()  # an earlier fetch's bytes, not the chunk (a wrong hash): fetched again
            data = None
        body, actions = await fetch.fetch(agent, step)
        return actions, body.data if body is not None else data
    if isinstance(step, agentsteps.AwaitHash):
        return await fetch.await_hash(agent, step), data
    if isinstance(step, agentsteps.Store):
        assert data is not None
        await chunks.accept(
            agent,
            step.index,
            data,
            digest=step.digest,
            from_origin=step.from_origin,
            generation=step.generation,
            source=step.source,
        )
        return agent.core.stored(step.job, now=now()), None
    if isinstance(step, agentsteps.Pull):
        pulled, actions = await seeder.pull(agent, step)
        return actions, pulled
    if isinstance(step, agentsteps.Reuse):
        return await seeder.reuse(agent, step), data
    raise AssertionError(f"not a job step: {step!r}")
