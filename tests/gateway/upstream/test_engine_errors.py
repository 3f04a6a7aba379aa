"""An engine's error body reduced to what a client may see: the message, never the insides."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from router.gateway.upstream.engine_errors import GENERIC, PublicError, clean, public_error

CONTEXT = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
    "(4990 in the messages, 10 in the completion). Please reduce the length of the messages."
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_chat.py", '
    "line 212, in create_chat_completion\n    raise ValueError(msg)\nValueError: bad"
)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {"object": "error", "message": CONTEXT, "type": "BadRequestError", "code": 400},
            PublicError(CONTEXT, "BadRequestError", 400),
            id="vllm-plain-message-kept",
        ),
        pytest.param(
            {"error": {"message": "rate limited", "type": "rate_limit_error", "code": "slow"}},
            PublicError("rate limited", "rate_limit_error", "slow"),
            id="openai-shape",
        ),
        pytest.param(
            {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}},
            PublicError("no", "invalid_request_error", None),
            id="anthropic-shape",
        ),
        pytest.param(
            {"detail": [{"loc": ["body", "model"], "msg": "field required"}]},
            PublicError("field required"),
            id="fastapi-details",
        ),
        pytest.param({"object": "error", "message": TRACEBACK}, PublicError(GENERIC), id="trace"),
        pytest.param(
            {"message": f"Request failed: {TRACEBACK}", "type": "InternalError"},
            PublicError("Request failed", "InternalError"),
            id="message-then-trace",
        ),
        pytest.param(
            {"message": "cannot load /srv/models/secret-weights/model.safetensors now"},
            PublicError("cannot load"),
            id="file-path",
        ),
        pytest.param(
            {"message": "POST /v1/chat/completions needs 'messages'"},
            PublicError("POST /v1/chat/completions needs 'messages'"),
            id="api-route-is-no-path",
        ),
        pytest.param(
            {"message": "state <vllm.engine.Core object at 0x7f3a2b1c9d40> is stuck"},
            PublicError("state"),
            id="object-repr",
        ),
        pytest.param(
            {"message": "bad", "type": "a type with spaces", "code": {"nested": 1}},
            PublicError("bad"),
            id="odd-type-and-code-dropped",
        ),
    ],
)
def test_public_error_keeps_the_message_and_drops_the_insides(
    body: dict[str, object], expected: PublicError
) -> None:
    assert public_error(orjson.dumps(body)) == expected


@pytest.mark.parametrize("raw", [b"", b"<html>500</html>", b"[1, 2]", b"null", b'"text"'])
def test_public_error_of_no_json_object_is_generic(raw: bytes) -> None:
    assert public_error(raw) == PublicError(GENERIC)


def test_clean_bounds_a_long_message_and_says_it_was_cut() -> None:
    out = clean("word " * 500, max_chars=100)
    assert len(out) == 100 and out.endswith("…")
    assert clean("two\n  lines\there") == "two lines here"


@given(st.binary(max_size=2048))
def test_public_error_any_bytes_a_bounded_message(raw: bytes) -> None:
    got = public_error(raw)
    assert got.message and len(got.message) <= 500
    assert "Traceback" not in got.message


@given(st.text(max_size=300), st.sampled_from(["/srv/a/b/c.bin", TRACEBACK, "x.py"]))
def test_public_error_never_lets_a_path_or_trace_out(prefix: str, internal: str) -> None:
    assume("SUFFIX" not in prefix)
    got = public_error(orjson.dumps({"message": f"{prefix} {internal} SUFFIX"}))
    assert internal not in got.message
    assert "SUFFIX" not in got.message  # nothing after the internals goes out either
