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
from ringseed.agent import fetch


def _always_fails(agent: Any, index: int, body: Any) -> bool:
    return False


def main() -> int:
    fetch._verified = _always_fails
    fetch.MAX_STREAMS = 0
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
