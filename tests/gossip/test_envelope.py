"""The envelope codec without a network: what it seals, what it accepts, how it counts refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import pytest

from router.gossip.auth import AuthError, ReplayGuard, Sealer
from router.gossip.envelope import EnvelopeCodec, Recipients, body_of
from router.gossip.stats import Counters
from router.gossip.wire import PROTOCOL_VERSION, pb

SECRET = b"0123456789abcdef-secret"
NOW = 1_700_000_000.0
WINDOW = 30.0
# Where each test node listens (advertised and bound).
ADDRESS = {"a": "10.0.0.1:7946", "b": "10.0.0.2:7946", "c": "10.0.0.3:7946"}


def _codec(
    node_id: str, secret: bytes | None = SECRET, counters: Counters | None = None
) -> EnvelopeCodec:
    replay = ReplayGuard.create(WINDOW, 100)
    codec = EnvelopeCodec(node_id, Sealer(secret), replay, 4096, counters or Counters())
    codec.listening(ADDRESS[node_id], ADDRESS[node_id])
    return codec


def _counted(node_id: str) -> tuple[EnvelopeCodec, Counters]:
    counters = Counters()
    return _codec(node_id, counters=counters), counters


def _refused(counters: Counters) -> dict[str, int]:
    return {k: v for k, v in asdict(counters).items() if k.startswith("refused_") and v}


def test_envelope_sealed_frame_accepted_unchanged() -> None:
    a, b = _codec("a"), _codec("b")
    frame = a.request(NOW, "b", ADDRESS["b"], ping=pb.Ping(target_id="b"))
    got = b.accept(a.seal(frame), NOW)
    assert got == frame
    assert (got.sender, got.version, got.sent_unix_ms) == ("a", PROTOCOL_VERSION, NOW * 1000)
    assert got.nonce != 0 and got.WhichOneof("body") == "ping"


def test_envelope_seal_and_accept_count_messages_and_bytes() -> None:
    (a, sent), (b, received) = _counted("a"), _counted("b")
    payload = a.seal(a.request(NOW, "b", "", ping=pb.Ping()))
    b.accept(payload, NOW)
    assert (sent.messages_out, sent.bytes_out) == (1, len(payload))
    assert (received.messages_in, received.bytes_in) == (1, len(payload))


@pytest.mark.parametrize(
    ("node_id", "address", "recipient"),
    [
        ("b", "10.0.0.2:7946", ("recipient_id", "b")),
        ("", "10.0.0.2:7946", ("recipient_address", "10.0.0.2:7946")),
    ],
    ids=["member_by_id", "first_contact_by_address"],
)
def test_envelope_request_names_the_id_else_the_address(
    node_id: str, address: str, recipient: tuple[str, str]
) -> None:
    frame = _codec("a").request(NOW, node_id, address, ping=pb.Ping())
    kind = frame.WhichOneof("recipient")
    assert (kind, getattr(frame, kind or "")) == recipient


def test_envelope_request_without_id_or_address_raises() -> None:
    with pytest.raises(ValueError, match="recipient"):
        _codec("a").request(NOW, "", "", ping=pb.Ping())


def test_envelope_reply_names_the_requester_and_answers_its_nonce() -> None:
    a, b = _codec("a"), _codec("b")
    request = a.request(NOW, "", ADDRESS["b"], ping=pb.Ping())
    reply = b.reply(request, NOW, ack=pb.Ack())
    assert (reply.recipient_id, reply.reply_to, reply.sender) == ("a", request.nonce, "b")


def _seal_version(version: int, recipient: bool) -> Callable[[EnvelopeCodec], bytes]:
    def make(a: EnvelopeCodec) -> bytes:
        frame = a.request(NOW, "b", "", ping=pb.Ping())
        frame.version = version
        if not recipient:
            frame.ClearField("recipient_id")
        return a.seal(frame)

    return make


def _sealed_by(other: EnvelopeCodec) -> Callable[[EnvelopeCodec], bytes]:
    return lambda a: other.seal(a.request(NOW, "b", "", ping=pb.Ping()))


def _ping_sent_at(wall: float, target: str = "") -> Callable[[EnvelopeCodec], bytes]:
    return lambda a: a.seal(a.request(wall, "b", "", ping=pb.Ping(target_id=target)))


def _sealed_for(node_id: str, address: str = "") -> Callable[[EnvelopeCodec], bytes]:
    return lambda a: a.seal(a.request(NOW, node_id, address, ping=pb.Ping()))


# Each case makes, as sender "a", the bytes that "b" is asked to accept.
@pytest.mark.parametrize(
    ("make", "counter"),
    [
        pytest.param(_sealed_by(_codec("a", b"another secret")), "refused_mac", id="wrong_secret"),
        pytest.param(_sealed_by(_codec("a", None)), "refused_mac", id="no_mac"),
        pytest.param(lambda a: b"\xff\x00garbage", "refused_malformed", id="garbage"),
        pytest.param(_ping_sent_at(NOW, "x" * 5000), "refused_malformed", id="oversize"),
        pytest.param(
            _seal_version(PROTOCOL_VERSION + 1, True), "refused_malformed", id="other_version"
        ),
        pytest.param(_ping_sent_at(NOW - 2 * WINDOW), "refused_stale", id="stale"),
        pytest.param(_ping_sent_at(NOW + 2 * WINDOW), "refused_stale", id="future"),
        pytest.param(_sealed_for("c"), "refused_recipient", id="for_another_id"),
        pytest.param(_sealed_for("", ADDRESS["c"]), "refused_recipient", id="for_another_address"),
        pytest.param(_sealed_for("", "b"), "refused_recipient", id="own_id_as_an_address"),
        pytest.param(_seal_version(PROTOCOL_VERSION, False), "refused_recipient", id="for_no_one"),
        # A peer from before recipients (version 1) is refused, not accepted as unbound.
        pytest.param(_seal_version(1, False), "refused_malformed", id="version_1_peer"),
    ],
)
def test_envelope_accept_refused_counted_by_reason(
    make: Callable[[EnvelopeCodec], bytes], counter: str
) -> None:
    a, (b, counters) = _codec("a"), _counted("b")
    with pytest.raises(AuthError):
        b.accept(make(a), NOW)
    assert _refused(counters) == {counter: 1}
    assert counters.messages_in == 1


@pytest.mark.parametrize(
    ("node_id", "address"),
    [("b", ""), ("", ADDRESS["b"]), ("b", ADDRESS["c"])],
    ids=["by_id", "by_address", "id_wins_over_a_stale_address"],
)
def test_envelope_frame_sealed_for_b_accepted_by_b_refused_by_c(node_id: str, address: str) -> None:
    a, (b, at_b), (c, at_c) = _codec("a"), _counted("b"), _counted("c")
    payload = a.seal(a.request(NOW, node_id, address, ping=pb.Ping()))
    with pytest.raises(AuthError, match="recipient"):
        c.accept(payload, NOW)
    assert b.accept(payload, NOW).sender == "a"
    assert (_refused(at_c), _refused(at_b)) == ({"refused_recipient": 1}, {})


def test_envelope_accept_same_envelope_twice_refused_as_replay() -> None:
    a, (b, counters) = _codec("a"), _counted("b")
    payload = a.seal(a.request(NOW, "b", "", ping=pb.Ping()))
    b.accept(payload, NOW)
    with pytest.raises(AuthError, match="replay"):
        b.accept(payload, NOW + 1)
    assert counters.refused_replay == 1


def _for_id(node_id: str) -> pb.Frame:
    return pb.Frame(recipient_id=node_id)


def _for_address(address: str) -> pb.Frame:
    return pb.Frame(recipient_address=address)


WILDCARD = Recipients.listening("w", advertised="10.0.0.5:7946", bound="0.0.0.0:7946")
ONE_INTERFACE = Recipients.listening("n", advertised="10.0.0.5:7946", bound="10.0.0.5:7946")
BY_NAME = Recipients.listening("n", advertised="Router-0.Fleet:7946", bound="10.0.0.5:7946")
V6 = Recipients.listening("n", advertised="[fd00::5]:7946", bound="[::]:7946")


@pytest.mark.parametrize(
    ("recipients", "frame", "accepted"),
    [
        pytest.param(Recipients("b"), _for_id("b"), True, id="own_id"),
        pytest.param(Recipients("b"), _for_id("c"), False, id="other_id"),
        pytest.param(Recipients("b"), _for_id(""), False, id="empty_id"),
        pytest.param(Recipients("b"), _for_address("b"), False, id="own_id_as_an_address"),
        pytest.param(Recipients("b"), pb.Frame(), False, id="no_recipient"),
        pytest.param(WILDCARD, _for_address("10.0.0.5:7946"), True, id="advertised"),
        pytest.param(WILDCARD, _for_address("10.0.0.6:7946"), False, id="other_host_same_port"),
        pytest.param(WILDCARD, _for_address("10.0.0.5:7947"), False, id="own_host_other_port"),
        pytest.param(WILDCARD, _for_address("127.0.0.1:7946"), True, id="wildcard_loopback_v4"),
        pytest.param(WILDCARD, _for_address("[::1]:7946"), True, id="wildcard_loopback_v6"),
        pytest.param(WILDCARD, _for_address("localhost:7946"), True, id="wildcard_localhost"),
        pytest.param(
            WILDCARD, _for_address("127.0.0.1:7947"), False, id="wildcard_loopback_other_port"
        ),
        pytest.param(WILDCARD, _for_address("not an address"), False, id="unparsable"),
        pytest.param(
            ONE_INTERFACE, _for_address("127.0.0.1:7946"), False, id="one_interface_no_loopback"
        ),
        pytest.param(BY_NAME, _for_address("router-0.fleet.:7946"), True, id="host_name_spelling"),
        pytest.param(BY_NAME, _for_address("10.0.0.5:7946"), True, id="bound_not_advertised"),
        pytest.param(V6, _for_address("[fd00:0:0::5]:7946"), True, id="ipv6_spelled_long"),
    ],
)
def test_recipients_accepts_own_id_and_own_addresses_only(
    recipients: Recipients, frame: pb.Frame, accepted: bool
) -> None:
    assert recipients.accepts(frame) is accepted


@pytest.mark.parametrize(
    ("body", "answers_request", "expected"),
    [
        ({"ack": pb.Ack()}, True, pb.Ack()),
        ({"ack": pb.Ack()}, False, None),
        ({"nack": pb.Nack(reason="busy")}, True, None),
        ({}, True, None),
    ],
    ids=["answer", "other_nonce", "nack", "no_body"],
)
def test_envelope_answer_only_for_an_answer_to_this_request(
    body: dict[str, object], answers_request: bool, expected: object
) -> None:
    (a, counters), b = _counted("a"), _codec("b")
    request = a.request(NOW, "b", "", ping=pb.Ping())
    reply = b.reply(request, NOW, **body)
    if not answers_request:
        reply.reply_to += 1
    got = a.answer(b.seal(reply), request)
    assert (None if got is None else body_of(got)) == expected
    assert _refused(counters) == ({} if answers_request else {"refused_replay": 1})


def _reply_to(requester: str) -> Callable[[pb.Frame, EnvelopeCodec], pb.Frame]:
    def make(request: pb.Frame, replier: EnvelopeCodec) -> pb.Frame:
        reply = replier.reply(request, NOW, ack=pb.Ack())
        reply.recipient_id = requester
        return reply

    return make


def _reply_for_no_one(request: pb.Frame, replier: EnvelopeCodec) -> pb.Frame:
    reply = replier.reply(request, NOW, ack=pb.Ack())
    reply.ClearField("recipient_id")
    return reply


# "a" asks for ``to`` (an id, else b's address); ``replier`` answers with ``make``.
@pytest.mark.parametrize(
    ("to", "replier", "make", "accepted"),
    [
        ("b", "b", _reply_to("a"), True),
        ("b", "b", _reply_to("c"), False),
        ("b", "b", _reply_for_no_one, False),
        ("b", "c", _reply_to("a"), False),
        ("", "b", _reply_to("a"), True),
        ("", "c", _reply_to("a"), True),
    ],
    ids=[
        "for_the_requester",
        "for_another_requester",
        "for_no_one",
        "from_another_node_than_asked",
        "first_contact_any_node_answers",
        "first_contact_another_node_answers",
    ],
)
def test_envelope_answer_bound_to_the_requester_and_the_node_asked(
    to: str, replier: str, make: Callable[[pb.Frame, EnvelopeCodec], pb.Frame], accepted: bool
) -> None:
    (a, counters), r = _counted("a"), _codec(replier)
    request = a.request(NOW, to, ADDRESS["b"], ping=pb.Ping())
    got = a.answer(r.seal(make(request, r)), request)
    assert (got is not None) is accepted
    assert _refused(counters) == ({} if accepted else {"refused_recipient": 1})


def test_envelope_answer_forged_reply_none_and_counted() -> None:
    a, counters = _counted("a")
    request = a.request(NOW, "b", "", ping=pb.Ping())
    forger = _codec("b", b"another secret")
    reply = forger.seal(forger.reply(request, NOW, ack=pb.Ack()))
    assert a.answer(reply, request) is None
    assert counters.refused_mac == 1
