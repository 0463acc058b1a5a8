"""Wire format of the collective data plane: frame headers and the link handshake (pure, no I/O).

What this module owns
- The fixed 32-byte frame header ``(magic, version, kind, dtype, op tag, sequence, byte count)``
  that precedes every payload on a ring link, its encoding and its validation.
- The handshake a dialer and a listener run on a fresh TCP connection before any frame:
  the listener sends a random challenge, the dialer answers with ``HELLO`` (peer id, epoch,
  purpose, channel, its own nonce and an HMAC-SHA256 over all of it keyed by the group
  token), the listener answers ``WELCOME`` (an HMAC over the dialer's nonce, so the dialer
  knows the listener holds the token too) or ``REJECT`` with a reason.

Rules
- Bytes go in, values or :class:`FrameError` come out. The transport (``collective/transport.py``)
  reads and writes sockets; on any ``FrameError`` it closes the connection and the collective
  raises ``CollectiveAborted`` with this error's message. A message always names the field,
  what was expected and what arrived, so a log line is enough to find a misbehaving peer.
- Decoding is strict: a header decodes only if encoding the result gives back the same bytes
  (the reserved byte must be 0), so one header has one meaning on every peer.
- A header is checked twice: on its own (magic, version, kind, dtype code, byte count under
  :data:`MAX_FRAME_BYTES`) by :func:`decode_header`, then against what the receiver expects
  at that point of the schedule (tag, sequence, dtype, length) by :func:`check_expected`.
  Nothing of a payload reaches a caller's buffer before both checks pass (the ring path reads
  no payload before them; the small-message path reads at most the expected frame into scratch
  first), so a malformed frame cannot write into a caller's buffer.
- Tokens never travel; only HMACs over fresh nonces do (compared in constant time).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import struct

MAGIC = b"RSDF"
VERSION = 1
MAX_FRAME_BYTES = 64 << 20  # a segment is at most a few MiB; anything larger is hostile
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_PEER_ID_BYTES = 253

_HEADER = struct.Struct("<4sBBBBQQQ")  # magic, version, kind, dtype, reserved (0), tag, sequence, nbytes
HEADER_BYTES = _HEADER.size
_CHALLENGE = struct.Struct(f"<4sB{NONCE_BYTES}s")
CHALLENGE_BYTES = _CHALLENGE.size
_HELLO_FIXED = struct.Struct(f"<4sBBHQ{NONCE_BYTES}s{MAC_BYTES}sB")  # ..., purpose, channel, epoch, nonce, mac, id len
HELLO_FIXED_BYTES = _HELLO_FIXED.size
_REPLY = struct.Struct(f"<4sBB{MAC_BYTES}sH")  # magic, version, status, mac, reason length
REPLY_FIXED_BYTES = _REPLY.size
MAX_REASON_BYTES = 1024


class FrameError(ValueError):
    """A frame or handshake message is malformed or not what the receiver expected."""


class Kind(enum.IntEnum):
    """What a frame carries."""

    DATA = 1  # a segment of a collective
    PROBE = 2  # bandwidth probe bytes
    PROBE_ACK = 3  # the probe's receiver got every byte
    MESSAGE = 4  # a point-to-point message on a direct link (tag: the matching key)


class DType(enum.IntEnum):
    """Element types on the wire (the engine's dtypes plus quantised encodings)."""

    F32 = 1
    F64 = 2
    F16 = 3
    BF16 = 4
    I8 = 5
    U8 = 6
    I16 = 7
    I32 = 8
    I64 = 9
    Q8 = 20  # int8 min-max quantised segment: float32 min, float32 scale, uint8 codes


class Purpose(enum.IntEnum):
    """Why a dialer opened a connection."""

    RING = 1  # carries collective frames from the dialer to its ring successor
    PROBE = 2  # one bandwidth measurement, then closed
    DIRECT = 3  # carries point-to-point messages from the dialer to one peer (any rank, not just the successor)


@dataclasses.dataclass(frozen=True)
class Header:
    """One frame header; ``nbytes`` payload bytes follow it."""

    kind: Kind
    dtype: DType
    tag: int
    sequence: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Hello:
    """The dialer's half of the handshake."""

    peer_id: str
    epoch: int
    purpose: Purpose
    channel: int
    nonce: bytes
    mac: bytes


def encode_header(header: Header) -> bytes:
    if not 0 <= header.nbytes <= MAX_FRAME_BYTES:
        raise FrameError(f"frame of {header.nbytes} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    _check_range("op tag", header.tag, bits=64)
    _check_range("sequence", header.sequence, bits=64)
    return _HEADER.pack(MAGIC, VERSION, header.kind, header.dtype, 0, header.tag, header.sequence, header.nbytes)


def decode_header(data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_FRAME_BYTES) -> Header:
    """Parse and validate a header on its own (magic, version, kind, dtype, size limit)."""
    if len(data) != HEADER_BYTES:
        raise FrameError(f"frame header is {len(data)} bytes, expected {HEADER_BYTES}")
    magic, version, kind, dtype, reserved, tag, sequence, nbytes = _HEADER.unpack(data)
    _check_preamble(magic, version, what="frame")
    if reserved != 0:
        raise FrameError(f"frame header's reserved byte is {reserved}, expected 0")
    if kind not in Kind._value2member_map_:
        raise FrameError(f"unknown frame kind {kind}")
    if dtype not in DType._value2member_map_:
        raise FrameError(f"unknown dtype code {dtype}")
    if nbytes > max_bytes:
        raise FrameError(f"frame announces {nbytes} bytes, over the limit of {max_bytes}")
    return Header(kind=Kind(kind), dtype=DType(dtype), tag=tag, sequence=sequence, nbytes=nbytes)


def check_expected(header: Header, *, kind: Kind, tag: int, sequence: int, dtype: DType, nbytes: int) -> None:
    """Raise FrameError naming the first field where ``header`` differs from the expectation."""
    for name, got, want in (
        ("kind", header.kind, kind),
        ("op tag", header.tag, tag),
        ("sequence", header.sequence, sequence),
        ("dtype", header.dtype, dtype),
        ("byte count", header.nbytes, nbytes),
    ):
        if got != want:
            raise FrameError(f"frame {name} mismatch: expected {_show(want)}, got {_show(got)} (tag {tag})")


def encode_challenge(nonce: bytes) -> bytes:
    _check_nonce(nonce)
    return _CHALLENGE.pack(MAGIC, VERSION, nonce)


def decode_challenge(data: bytes) -> bytes:
    if len(data) != CHALLENGE_BYTES:
        raise FrameError(f"handshake challenge is {len(data)} bytes, expected {CHALLENGE_BYTES}")
    magic, version, nonce = _CHALLENGE.unpack(data)
    _check_preamble(magic, version, what="handshake challenge")
    return bytes(nonce)


def make_hello(
    *, token: str, challenge: bytes, peer_id: str, epoch: int, purpose: Purpose, channel: int, nonce: bytes
) -> bytes:
    """The dialer's HELLO: fixed part, then the UTF-8 peer id."""
    _check_nonce(nonce)
    _check_range("epoch", epoch, bits=64)
    _check_range("channel", channel, bits=16)
    pid = peer_id.encode()
    if not 0 < len(pid) <= MAX_PEER_ID_BYTES:
        raise FrameError(f"peer id must be 1..{MAX_PEER_ID_BYTES} bytes, got {len(pid)}")
    mac = _hello_mac(
        token=token, challenge=challenge, peer_id=pid, epoch=epoch, purpose=purpose, channel=channel, nonce=nonce
    )
    return _HELLO_FIXED.pack(MAGIC, VERSION, purpose, channel, epoch, nonce, mac, len(pid)) + pid


def decode_hello_fixed(data: bytes) -> tuple[Purpose, int, int, bytes, bytes, int]:
    """Parse the fixed part; returns (purpose, channel, epoch, nonce, mac, peer id length)."""
    if len(data) != HELLO_FIXED_BYTES:
        raise FrameError(f"handshake hello is {len(data)} bytes, expected {HELLO_FIXED_BYTES}")
    magic, version, purpose, channel, epoch, nonce, mac, id_len = _HELLO_FIXED.unpack(data)
    _check_preamble(magic, version, what="handshake hello")
    if purpose not in Purpose._value2member_map_:
        raise FrameError(f"unknown connection purpose {purpose}")
    if id_len == 0:
        raise FrameError("handshake hello carries an empty peer id")
    return Purpose(purpose), channel, epoch, bytes(nonce), bytes(mac), id_len


def verify_hello(*, token: str, challenge: bytes, fixed: bytes, peer_id_bytes: bytes) -> Hello:
    """Check a complete HELLO against the challenge sent; raise FrameError on a wrong token."""
    purpose, channel, epoch, nonce, mac, id_len = decode_hello_fixed(fixed)
    if len(peer_id_bytes) != id_len:
        raise FrameError(f"handshake peer id is {len(peer_id_bytes)} bytes, expected {id_len}")
    try:
        peer_id = peer_id_bytes.decode()
    except UnicodeDecodeError as exc:
        raise FrameError("handshake peer id is not UTF-8") from exc
    want = _hello_mac(
        token=token,
        challenge=challenge,
        peer_id=peer_id_bytes,
        epoch=epoch,
        purpose=purpose,
        channel=channel,
        nonce=nonce,
    )
    if not hmac.compare_digest(want, mac):
        raise FrameError(f"handshake from peer {peer_id!r} failed: wrong group token")
    return Hello(peer_id=peer_id, epoch=epoch, purpose=purpose, channel=channel, nonce=nonce, mac=mac)


def make_reply(*, token: str, hello_nonce: bytes, reject_reason: str | None = None) -> bytes:
    """WELCOME (status 0, MAC proving the listener's token) or REJECT (status 1, reason)."""
    if reject_reason is None:
        return _REPLY.pack(MAGIC, VERSION, 0, _reply_mac(token, hello_nonce), 0)
    reason = reject_reason.encode()[:MAX_REASON_BYTES]
    return _REPLY.pack(MAGIC, VERSION, 1, bytes(MAC_BYTES), len(reason)) + reason


def decode_reply_fixed(data: bytes) -> tuple[int, bytes, int]:
    """Parse a reply's fixed part; returns (status, mac, reason length)."""
    if len(data) != REPLY_FIXED_BYTES:
        raise FrameError(f"handshake reply is {len(data)} bytes, expected {REPLY_FIXED_BYTES}")
    magic, version, status, mac, reason_len = _REPLY.unpack(data)
    _check_preamble(magic, version, what="handshake reply")
    if reason_len > MAX_REASON_BYTES:
        raise FrameError(f"handshake reply reason of {reason_len} bytes is over {MAX_REASON_BYTES}")
    return status, bytes(mac), reason_len


def check_reply(*, token: str, hello_nonce: bytes, status: int, mac: bytes, reason: bytes) -> None:
    """Raise FrameError when the listener rejected us, does not hold the token, or sent a malformed reply."""
    if status == 1:
        raise FrameError(f"peer rejected the connection: {reason.decode(errors='replace')}")
    if status != 0:
        raise FrameError(f"handshake reply has unknown status {status}")
    if reason:
        raise FrameError(f"handshake welcome carries a {len(reason)}-byte reason")
    if not hmac.compare_digest(_reply_mac(token, hello_nonce), mac):
        raise FrameError("listener failed the handshake: wrong group token")


def _hello_mac(
    *, token: str, challenge: bytes, peer_id: bytes, epoch: int, purpose: int, channel: int, nonce: bytes
) -> bytes:
    msg = b"hello" + challenge + nonce + struct.pack("<QBH", epoch, purpose, channel) + peer_id
    return hmac.new(token.encode(), msg, hashlib.sha256).digest()


def _reply_mac(token: str, hello_nonce: bytes) -> bytes:
    return hmac.new(token.encode(), b"welcome" + hello_nonce, hashlib.sha256).digest()


def _check_preamble(magic: bytes, version: int, *, what: str) -> None:
    if magic != MAGIC:
        raise FrameError(f"{what} has bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError(f"{what} has unsupported version {version}, expected {VERSION}")


def _check_range(name: str, value: int, *, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise FrameError(f"{name} {value} does not fit in {bits} unsigned bits")


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise FrameError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")


def _show(value: object) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)
