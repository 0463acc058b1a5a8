"""Property tests of the frame and handshake decoders (hypothesis): any bytes, random or a valid
message mutated, either decode or raise the module's own FrameError; valid messages round-trip."""

from __future__ import annotations

import contextlib
import struct

from hypothesis import given
from hypothesis import strategies as st

from ringseed.protocol import frames

U64 = st.integers(0, 2**64 - 1)
TOKEN = "group-token"
CHALLENGE = bytes(range(frames.NONCE_BYTES))

headers = st.builds(
    frames.Header,
    kind=st.sampled_from(frames.Kind),
    dtype=st.sampled_from(frames.DType),
    tag=U64,
    sequence=U64,
    nbytes=st.integers(0, frames.MAX_FRAME_BYTES),
)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` with some bytes overwritten, or cut, or extended."""
    data = bytearray(valid)
    # distinct positions: overwriting one position twice could put its old byte back (no mutation)
    for i in draw(st.sets(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
        data[i] = draw(st.integers(0, 255).filter(lambda b, old=data[i]: b != old))
    how = draw(st.sampled_from(["overwrite", "cut", "extend"]))
    if how == "cut":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "extend":
        return bytes(data) + draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@given(headers)
def test_valid_headers_round_trip(header: frames.Header) -> None:
    data = frames.encode_header(header)
    assert len(data) == frames.HEADER_BYTES
    for form in (data, bytearray(data), memoryview(data)):
        assert frames.decode_header(form) == header


@given(st.binary(max_size=2 * frames.HEADER_BYTES))
def test_random_bytes_decode_canonically_or_raise_frame_error(data: bytes) -> None:
    try:
        header = frames.decode_header(data)
    except frames.FrameError:
        return
    assert frames.encode_header(header) == data  # strict: one header, one byte string


@given(st.data(), headers)
def test_mutated_headers_decode_canonically_or_raise_frame_error(data: st.DataObject, header: frames.Header) -> None:
    raw = data.draw(mutated(frames.encode_header(header)))
    try:
        decoded = frames.decode_header(raw, max_bytes=data.draw(st.integers(0, frames.MAX_FRAME_BYTES)))
    except frames.FrameError:
        return
    assert frames.encode_header(decoded) == raw


@given(headers, headers)
def test_check_expected_passes_only_the_expected_header(got: frames.Header, want: frames.Header) -> None:
    expect = dict(kind=want.kind, tag=want.tag, sequence=want.sequence, dtype=want.dtype, nbytes=want.nbytes)
    try:
        frames.check_expected(got, **expect)  # type: ignore[arg-type]
    except frames.FrameError as exc:
        assert got != want and "mismatch" in str(exc)
    else:
        assert got == want


@given(
    peer_id=st.text(min_size=1, max_size=60).filter(lambda s: 0 < len(s.encode()) <= frames.MAX_PEER_ID_BYTES),
    epoch=U64,
    purpose=st.sampled_from(frames.Purpose),
    channel=st.integers(0, 2**16 - 1),
    nonce=st.binary(min_size=frames.NONCE_BYTES, max_size=frames.NONCE_BYTES),
)
def test_valid_hellos_verify_with_their_fields(
    peer_id: str, epoch: int, purpose: frames.Purpose, channel: int, nonce: bytes
) -> None:
    hello = frames.make_hello(
        token=TOKEN, challenge=CHALLENGE, peer_id=peer_id, epoch=epoch, purpose=purpose, channel=channel, nonce=nonce
    )
    fixed, rest = hello[: frames.HELLO_FIXED_BYTES], hello[frames.HELLO_FIXED_BYTES :]
    got = frames.verify_hello(token=TOKEN, challenge=CHALLENGE, fixed=fixed, peer_id_bytes=rest)
    assert (got.peer_id, got.epoch, got.purpose, got.channel, got.nonce) == (peer_id, epoch, purpose, channel, nonce)


def _valid_hello() -> bytes:
    return frames.make_hello(
        token=TOKEN,
        challenge=CHALLENGE,
        peer_id="peer-7",
        epoch=3,
        purpose=frames.Purpose.RING,
        channel=1,
        nonce=bytes(frames.NONCE_BYTES),
    )


@given(st.data())
def test_any_mutation_of_a_hello_is_refused(data: st.DataObject) -> None:
    """Every byte of HELLO is covered by a check or by the MAC: no mutation gets through."""
    raw = data.draw(mutated(_valid_hello()))
    fixed, rest = raw[: frames.HELLO_FIXED_BYTES], raw[frames.HELLO_FIXED_BYTES :]
    try:
        frames.verify_hello(token=TOKEN, challenge=CHALLENGE, fixed=fixed, peer_id_bytes=rest)
    except frames.FrameError:
        return
    raise AssertionError(f"mutated hello {raw!r} was accepted")


@given(st.binary(max_size=frames.HELLO_FIXED_BYTES + 300), st.binary(max_size=300))
def test_random_handshake_bytes_raise_only_frame_error(fixed: bytes, rest: bytes) -> None:
    for decode in (
        lambda: frames.decode_challenge(fixed[: frames.CHALLENGE_BYTES]),
        lambda: frames.decode_hello_fixed(fixed[: frames.HELLO_FIXED_BYTES]),
        lambda: frames.verify_hello(
            token=TOKEN, challenge=CHALLENGE, fixed=fixed[: frames.HELLO_FIXED_BYTES], peer_id_bytes=rest
        ),
        lambda: frames.decode_reply_fixed(fixed[: frames.REPLY_FIXED_BYTES]),
    ):
        with contextlib.suppress(frames.FrameError):
            decode()


@given(st.data(), st.sampled_from(["welcome", "reject"]))
def test_mutated_replies_are_refused_or_read_as_a_rejection(data: st.DataObject, kind: str) -> None:
    nonce = bytes(range(1, frames.NONCE_BYTES + 1))
    valid = frames.make_reply(token=TOKEN, hello_nonce=nonce, reject_reason=None if kind == "welcome" else "busy")
    raw = data.draw(mutated(valid))
    try:
        status, mac, reason_len = frames.decode_reply_fixed(raw[: frames.REPLY_FIXED_BYTES])
        reason = raw[frames.REPLY_FIXED_BYTES : frames.REPLY_FIXED_BYTES + reason_len]
        if len(reason) < reason_len:
            return  # truncated: the transport's read fails before the reply is checked
        frames.check_reply(token=TOKEN, hello_nonce=nonce, status=status, mac=mac, reason=reason)
    except frames.FrameError:
        return
    # accepted: only possible when the mutation left the fixed part intact (the tail is not read)
    assert raw[: frames.REPLY_FIXED_BYTES] == valid[: frames.REPLY_FIXED_BYTES]


@given(st.integers(-(2**70), 2**70), st.integers(-(2**70), 2**70))
def test_out_of_range_numbers_are_frame_errors_not_struct_errors(tag: int, epoch: int) -> None:
    header = frames.Header(kind=frames.Kind.DATA, dtype=frames.DType.F32, tag=tag, sequence=0, nbytes=0)
    try:
        assert frames.decode_header(frames.encode_header(header)).tag == tag
    except frames.FrameError:
        assert not 0 <= tag < 2**64
    try:
        frames.make_hello(
            token=TOKEN,
            challenge=CHALLENGE,
            peer_id="p",
            epoch=epoch,
            purpose=frames.Purpose.RING,
            channel=0,
            nonce=bytes(frames.NONCE_BYTES),
        )
    except frames.FrameError:
        assert not 0 <= epoch < 2**64


def test_reserved_byte_must_be_zero() -> None:
    raw = bytearray(frames.encode_header(frames.Header(frames.Kind.DATA, frames.DType.F32, 1, 2, 3)))
    raw[7] = 1
    try:
        frames.decode_header(bytes(raw))
    except frames.FrameError as exc:
        assert "reserved byte" in str(exc)
    else:
        raise AssertionError("a non-zero reserved byte was accepted")
    assert struct.calcsize("<4sBBBBQQQ") == frames.HEADER_BYTES
