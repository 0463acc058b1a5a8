"""The first error of a child's log, as the console shows it."""

from __future__ import annotations

from ringseed.local import swarm

TRACEBACK = """2026-11-30 10:00:00,000 INFO ringseed.agent.agent: Agent node-0 serving chunks at http://127.0.0.1:1
Traceback (most recent call last):
  File "/x/ringseed/agent/agent.py", line 1, in run
    await self._work(stop)
ringseed.agent.origins.base.OriginError: file:///m: no such file or directory
"""

CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in f
FileNotFoundError: [Errno 2] No such file or directory: '/m'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "b.py", line 2, in g
ringseed.agent.origins.base.OriginError: /m: gone
"""

LOGGED = """2026-11-30 10:00:00,000 INFO ringseed.agent.agent: starting
2026-11-30 10:00:01,000 ERROR ringseed.agent.agent: Model digest 1 is not the expected 2; not publishing it
2026-11-30 10:00:02,000 ERROR ringseed.agent.agent: a later one
"""


def test_a_traceback_gives_its_exception_line_without_the_module_path() -> None:
    assert swarm.first_error(TRACEBACK) == "OriginError: file:///m: no such file or directory"


def test_a_chained_traceback_gives_the_first_cause() -> None:
    assert swarm.first_error(CHAINED) == "FileNotFoundError: [Errno 2] No such file or directory: '/m'"


def test_a_logged_error_gives_its_message() -> None:
    assert swarm.first_error(LOGGED) == "Model digest 1 is not the expected 2; not publishing it"


def test_a_clean_log_has_none() -> None:
    assert swarm.first_error("2026-11-30 10:00:00,000 INFO x: fine\n") is None
