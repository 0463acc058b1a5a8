"""What the agent core asks its driver to do, and what a fetch brought back: frozen values.

Owns the vocabulary between :class:`ringseed.protocol.agentcore.AgentCore` and whoever drives
it (the aiohttp agent, the simulator). A job's steps carry its id; the driver answers each
with the core's event of the same name (``FindHolders`` -> ``AgentCore.holders``, ``Fetch``
-> ``AgentCore.fetched``, ``Store`` -> ``AgentCore.stored``, ...). Actions without a job id
are carried out at once (``Report``, ``SetProblem``, ``ClearProblem``, ``Cancel``,
``Retake``) or answered by their own event (``Claim`` -> ``AgentCore.claimed``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ringseed.protocol import choice

# -- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindHolders:
    """Ask the tracker who holds ``index``; answer with ``AgentCore.holders``."""

    job: int
    index: int


@dataclass(frozen=True)
class FindSource:
    """Ask the tracker for holders of ``index`` or the node pulling it; answer with ``AgentCore.sources``."""

    job: int
    index: int


@dataclass(frozen=True)
class Fetch:
    """Get chunk ``index`` from ``holder`` (``stream``: as it arrives from the origin); answer with
    ``AgentCore.fetched``."""

    job: int
    index: int
    holder: choice.Holder
    stream: bool


@dataclass(frozen=True)
class AwaitHash:
    """Wait until the tracker's hash of ``index`` is known (learn it) or ``until``; then
    ``AgentCore.hash_waited``."""

    job: int
    index: int
    until: float


@dataclass(frozen=True)
class Store:
    """Hold the job's verified bytes of ``index`` (memory, disk behind); answer with ``AgentCore.stored``."""

    job: int
    index: int
    digest: str
    from_origin: bool
    source: str | None
    generation: int


@dataclass(frozen=True)
class Pull:
    """Read chunk ``index`` from the origin (report progress, the read's end, then the digest or the failure)."""

    job: int
    index: int


@dataclass(frozen=True)
class Reuse:
    """A claimed chunk with bytes kept from another revision: check or prove them, then ``AgentCore.reused``."""

    job: int
    index: int


@dataclass(frozen=True)
class Cancel:
    """Stop job ``job`` (its chunk is held now); no event is expected from it."""

    job: int


@dataclass(frozen=True)
class Claim:
    """Ask the tracker for up to ``count`` origin assignments; answer with ``AgentCore.claimed``."""

    count: int


@dataclass(frozen=True)
class Report:
    """Tell the tracker that ``peer`` served bytes of ``index`` that failed verification."""

    peer: str
    index: int


@dataclass(frozen=True)
class SetProblem:
    reason: str
    message: str


@dataclass(frozen=True)
class ClearProblem:
    reason: str


@dataclass(frozen=True)
class Retake:
    """Take the revision from the source again (it changed, or the duty was just gained)."""


Action = (
    FindHolders | FindSource | Fetch | AwaitHash | Store | Pull | Reuse | Cancel | Claim | Report | SetProblem
    | ClearProblem | Retake
)  # fmt: skip


# -- what a fetch brought back ---------------------------------------------------------------


@dataclass(frozen=True)
class Got:
    """A whole body of ``length`` bytes and its SHA-256 (None: longer than the chunk, never a match)."""

    length: int
    digest: str | None


@dataclass(frozen=True)
class Refused:
    """An HTTP status other than 200 (429 busy, 404 not held, 409 another revision)."""

    status: int


@dataclass(frozen=True)
class Unreachable:
    """No answer (connection refused, reset, timed out before a status)."""

    error: str = ""


@dataclass(frozen=True)
class Broken:
    """A 200 whose body was cut short after ``received`` bytes."""

    received: int


FetchResult = Got | Refused | Unreachable | Broken


class PullFailure(enum.Enum):
    """Why an origin pull failed."""

    SOURCE_CHANGED = "source_changed"  # a file is no longer the pinned one
    ERROR = "error"  # the origin failed (I/O, HTTP, timeout)
