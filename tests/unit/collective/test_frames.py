"""Frame headers and the handshake, bytes in and out (no sockets)."""

from __future__ import annotations

import os
import struct

import pytest

from ringseed.protocol import frames

HEADER = frames.Header(kind=frames.Kind.DATA, dtype=frames.DType.BF16, tag=2**40 + 3, sequence=17, nbytes=4096)


def test_header_round_trip() -> None:
    data = frames.encode_header(HEADER)
    assert len(data) == frames.HEADER_BYTES
    assert frames.decode_header(data) == HEADER


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:4] + bytes([2]) + b[5:], "unsupported version 2"),
        (lambda b: b[:5] + bytes([77]) + b[6:], "unknown frame kind 77"),
        (lambda b: b[:6] + bytes([99]) + b[7:], "unknown dtype code 99"),
        (lambda b: b[:-8] + struct.pack("<Q", frames.MAX_FRAME_BYTES + 1), "over the limit"),
        (lambda b: b[:-1], "expected 32"),
    ],
    ids=["magic", "version", "kind", "dtype", "oversize", "short"],
)
def test_malformed_header_is_refused_with_reason(mutate: object, message: str) -> None:
    with pytest.raises(frames.FrameError, match=message):
        frames.decode_header(mutate(frames.encode_header(HEADER)))  # type: ignore[operator]


def test_encode_refuses_oversize() -> None:
    with pytest.raises(frames.FrameError, match="exceeds"):
        frames.encode_header(
            frames.Header(
                kind=frames.Kind.DATA, dtype=frames.DType.U8, tag=0, sequence=0, nbytes=frames.MAX_FRAME_BYTES + 1
            )
        )


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("op tag", {"tag": 1}),
        ("sequence", {"sequence": 16}),
        ("dtype", {"dtype": frames.DType.F32}),
        ("byte count", {"nbytes": 4095}),
        ("kind", {"kind": frames.Kind.PROBE}),
    ],
)
def test_expectation_mismatch_names_the_field(field: str, kwargs: dict[str, object]) -> None:
    want: dict[str, object] = {
        "kind": HEADER.kind,
        "tag": HEADER.tag,
        "sequence": HEADER.sequence,
        "dtype": HEADER.dtype,
        "nbytes": HEADER.nbytes,
    }
    frames.check_expected(HEADER, **want)  # type: ignore[arg-type]
    with pytest.raises(frames.FrameError, match=f"{field} mismatch"):
        frames.check_expected(HEADER, **{**want, **kwargs})  # type: ignore[arg-type]


def handshake(*, dialer_token: str, listener_token: str) -> frames.Hello:
    challenge = frames.decode_challenge(frames.encode_challenge(os.urandom(frames.NONCE_BYTES)))
    nonce = os.urandom(frames.NONCE_BYTES)
    hello = frames.make_hello(
        token=dialer_token,
        challenge=challenge,
        peer_id="node-ä",
        epoch=7,
        purpose=frames.Purpose.RING,
        channel=2,
        nonce=nonce,
    )
    fixed, pid = hello[: frames.HELLO_FIXED_BYTES], hello[frames.HELLO_FIXED_BYTES :]
    got = frames.verify_hello(token=listener_token, challenge=challenge, fixed=fixed, peer_id_bytes=pid)
    reply = frames.make_reply(token=listener_token, hello_nonce=got.nonce)
    status, mac, n = frames.decode_reply_fixed(reply[: frames.REPLY_FIXED_BYTES])
    frames.check_reply(token=dialer_token, hello_nonce=nonce, status=status, mac=mac, reason=reply[-n:] if n else b"")
    return got


def test_handshake_carries_identity_and_epoch() -> None:
    hello = handshake(dialer_token="s3cret", listener_token="s3cret")
    assert (hello.peer_id, hello.epoch, hello.purpose, hello.channel) == ("node-ä", 7, frames.Purpose.RING, 2)


def test_wrong_token_fails_the_handshake() -> None:
    with pytest.raises(frames.FrameError, match="wrong group token"):
        handshake(dialer_token="guess", listener_token="s3cret")


def test_hello_for_another_challenge_is_refused() -> None:
    nonce = os.urandom(frames.NONCE_BYTES)
    hello = frames.make_hello(
        token="t", challenge=b"a" * 16, peer_id="p", epoch=1, purpose=frames.Purpose.RING, channel=0, nonce=nonce
    )
    with pytest.raises(frames.FrameError, match="wrong group token"):  # a replayed hello
        frames.verify_hello(
            token="t",
            challenge=b"b" * 16,
            fixed=hello[: frames.HELLO_FIXED_BYTES],
            peer_id_bytes=hello[frames.HELLO_FIXED_BYTES :],
        )


def test_reject_reply_carries_the_reason() -> None:
    reply = frames.make_reply(token="t", hello_nonce=b"", reject_reason="stale epoch 3, current is 4")
    status, mac, n = frames.decode_reply_fixed(reply[: frames.REPLY_FIXED_BYTES])
    with pytest.raises(frames.FrameError, match="rejected the connection: stale epoch 3"):
        frames.check_reply(token="t", hello_nonce=b"", status=status, mac=mac, reason=reply[-n:])
