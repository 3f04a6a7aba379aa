"""The envelope codec without a network: what it seals, what it accepts, how it counts refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import pytest

from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.envelope import EnvelopeCodec
from router.gossip.stats import Counters
from router.gossip.wire import PROTOCOL_VERSION, pb

SECRET = b"0123456789abcdef-secret"
NOW = 1_700_000_000.0
WINDOW = 30.0


def _codec(
    node_id: str, secret: bytes | None = SECRET, counters: Counters | None = None
) -> EnvelopeCodec:
    replay = ReplayGuard.create(WINDOW, 100)
    return EnvelopeCodec(node_id, Sealer(secret), replay, 4096, counters or Counters())


def _counted(node_id: str) -> tuple[EnvelopeCodec, Counters]:
    counters = Counters()
    return _codec(node_id, counters=counters), counters


def test_envelope_sealed_frame_accepted_unchanged() -> None:
    a, b = _codec("a"), _codec("b")
    frame = a.frame(NOW, ping=pb.Ping(target_id="b"))
    got = b.accept(a.seal(frame), NOW)
    assert got == frame
    assert (got.sender, got.version, got.sent_unix_ms) == ("a", PROTOCOL_VERSION, NOW * 1000)
    assert got.nonce != 0 and got.WhichOneof("body") == "ping"


def test_envelope_seal_and_accept_count_messages_and_bytes() -> None:
    (a, sent), (b, received) = _counted("a"), _counted("b")
    payload = a.seal(a.frame(NOW, ping=pb.Ping()))
    b.accept(payload, NOW)
    assert (sent.messages_out, sent.bytes_out) == (1, len(payload))
    assert (received.messages_in, received.bytes_in) == (1, len(payload))


def _seal_other_version(a: EnvelopeCodec) -> bytes:
    frame = a.frame(NOW, ping=pb.Ping())
    frame.version = PROTOCOL_VERSION + 1
    return a.seal(frame)


def _sealed_by(other: EnvelopeCodec) -> Callable[[EnvelopeCodec], bytes]:
    return lambda a: other.seal(a.frame(NOW, ping=pb.Ping()))


def _ping_sent_at(wall: float, target: str = "") -> Callable[[EnvelopeCodec], bytes]:
    return lambda a: a.seal(a.frame(wall, ping=pb.Ping(target_id=target)))


# Each case makes, as sender "a", the bytes that "b" is asked to accept.
@pytest.mark.parametrize(
    ("make", "counter"),
    [
        pytest.param(_sealed_by(_codec("a", b"another secret")), "refused_mac", id="wrong_secret"),
        pytest.param(_sealed_by(_codec("a", None)), "refused_mac", id="no_mac"),
        pytest.param(lambda a: b"\xff\x00garbage", "refused_malformed", id="garbage"),
        pytest.param(_ping_sent_at(NOW, "x" * 5000), "refused_malformed", id="oversize"),
        pytest.param(_seal_other_version, "refused_malformed", id="other_version"),
        pytest.param(_ping_sent_at(NOW - 2 * WINDOW), "refused_stale", id="stale"),
        pytest.param(_ping_sent_at(NOW + 2 * WINDOW), "refused_stale", id="future"),
    ],
)
def test_envelope_accept_refused_counted_by_reason(
    make: Callable[[EnvelopeCodec], bytes], counter: str
) -> None:
    a, (b, counters) = _codec("a"), _counted("b")
    with pytest.raises(AuthError):
        b.accept(make(a), NOW)
    refused = {k: v for k, v in asdict(counters).items() if k.startswith("refused_") and v}
    assert refused == {counter: 1}
    assert counters.messages_in == 1


def test_envelope_accept_same_envelope_twice_refused_as_replay() -> None:
    a, (b, counters) = _codec("a"), _counted("b")
    payload = a.seal(a.frame(NOW, ping=pb.Ping()))
    b.accept(payload, NOW)
    with pytest.raises(AuthError, match="replay"):
        b.accept(payload, NOW + 1)
    assert counters.refused_replay == 1


@pytest.mark.parametrize(
    ("body", "answers_request", "expected", "refused_replay"),
    [
        ({"ack": pb.Ack()}, True, pb.Ack(), 0),
        ({"ack": pb.Ack()}, False, None, 1),
        ({"nack": pb.Nack(reason="busy")}, True, None, 0),
        ({}, True, None, 0),
    ],
    ids=["answer", "other_nonce", "nack", "no_body"],
)
def test_envelope_reply_body_only_for_an_answer_to_this_request(
    body: dict[str, object], answers_request: bool, expected: object, refused_replay: int
) -> None:
    (a, counters), b = _counted("a"), _codec("b")
    request = a.frame(NOW, ping=pb.Ping())
    reply_to = request.nonce if answers_request else request.nonce + 1
    reply = b.seal(b.frame(NOW, reply_to=reply_to, **body))
    assert a.reply_body(reply, request.nonce) == expected
    assert counters.refused_replay == refused_replay


def test_envelope_reply_body_forged_reply_none_and_counted() -> None:
    a, counters = _counted("a")
    request = a.frame(NOW, ping=pb.Ping())
    forger = _codec("b", b"another secret")
    reply = forger.seal(forger.frame(NOW, reply_to=request.nonce, ack=pb.Ack()))
    assert a.reply_body(reply, request.nonce) is None
    assert counters.refused_mac == 1
