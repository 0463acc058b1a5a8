"""A faulty receiver for the trust tests: ``python -m tests.component.distribution.bad_ram_agent agent ...``.

A real agent process (``ringseed.cli``) whose verification of received chunks always fails, as
on a node with bad memory: it reports every holder it fetches from, and never streams. Its
origin pulls are unaffected (it would be a fine origin-duty node); what matters is what its
reports do. The fault lives here, in the tests, not behind a switch in the production agent.
"""

from __future__ import annotations

import sys
from typing import Any

from ringseed import cli
from ringseed.protocol import agentcore


def _always_fails(core: Any, index: int, got: Any) -> bool:
    return False


def _never_streams(core: Any, free: int, now: float) -> list[int]:
    return []


def main() -> int:
    agentcore.AgentCore._verified = _always_fails  # type: ignore[method-assign]
    agentcore.AgentCore._stream_picks = _never_streams  # type: ignore[method-assign]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
