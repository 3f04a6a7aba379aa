"""The error tree drawn in router.gateway.openai.errors is the tree the classes make."""

from __future__ import annotations

import importlib
import json

import pytest

from router.gateway.openai import errors, sse
from router.gateway.openai.errors import (
    Api,
    BadRequest,
    GatewayError,
    NoEngine,
    NotFound,
    TooBusy,
    UpstreamDropped,
    api_of,
    error_response,
    stream_error,
    vllm_dialect,
)

# Modules outside router.gateway.openai.errors that define GatewayError subclasses.
DEFINERS = ["router.gateway.inbound.auth", "router.enginesim.faults"]


def drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, with the parent it is drawn under."""
    doc = errors.__doc__ or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("GatewayError"))
    root = lines[start].index("GatewayError")
    parents: dict[str, str | None] = {"GatewayError": None}
    path = ["GatewayError"]  # the branch drawn down to the line before
    for line in lines[start + 1 :]:
        marker = max(line.find("├── "), line.find("└── "))
        if marker < 0:
            break
        depth = (marker - root) // 4 + 1
        name = line[marker + 4 :].split()[0]
        del path[depth:]
        parents[name] = path[-1]
        path.append(name)
    return parents


def class_tree() -> dict[str, str | None]:
    """Each GatewayError subclass router defines, with its parent."""
    for name in DEFINERS:
        importlib.import_module(name)
    found: dict[str, str | None] = {"GatewayError": None}
    todo = [GatewayError]
    for _ in range(1000):  # bounded: the tree has a few dozen classes
        if not todo:
            break
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("router."):  # not a test's own subclass
                found[sub.__name__] = cls.__name__
                todo.append(sub)
    return found


def test_error_tree_drawing_names_every_class_under_its_parent() -> None:
    drawn, real = drawn_tree(), class_tree()
    assert len(drawn) > 10, "the drawing was not found where the test looks"
    assert drawn == real


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", Api.OPENAI),
        ("/v1/responses", Api.RESPONSES),
        ("/v1/messages", Api.ANTHROPIC),
        ("/v1/messages/count_tokens", Api.ANTHROPIC),
        ("/metrics", Api.OPENAI),
    ],
)
def test_api_of_path(path: str, api: Api) -> None:
    assert api_of(path) is api


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (BadRequest("bad 'x'", "x"), 400, "invalid_request_error"),
        (NotFound("no model"), 404, "not_found_error"),
        (TooBusy("full"), 429, "rate_limit_error"),
        (NoEngine("none"), 503, "overloaded_error"),
        (UpstreamDropped("cut", "http://e"), 502, "api_error"),
        (ValueError("boom"), 500, "api_error"),
    ],
    ids=["400", "404", "429", "503", "502", "500"],
)
def test_anthropic_errors_take_anthropics_envelope_and_types(
    exc: BaseException, status: int, kind: str
) -> None:
    for dialect in (errors.openai_dialect, vllm_dialect):  # Anthropic spells its own types
        resp = error_response(exc, api=Api.ANTHROPIC, dialect=dialect, request_id="r1")
        assert resp.status == status and resp.body is not None
        body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == kind
        if status >= 500:
            assert "r1" in body["error"]["message"]


def test_responses_errors_keep_openais_body() -> None:
    resp = error_response(BadRequest("bad 'x'", "x"), api=Api.RESPONSES)
    assert resp.body is not None
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert body == {
        "error": {"message": "bad 'x'", "type": "invalid_request_error", "param": "x", "code": None}
    }


@pytest.mark.parametrize("api", list(Api))
def test_stream_errors_in_each_apis_event(api: Api) -> None:
    (event,) = sse.Decoder().feed(stream_error(UpstreamDropped("cut"), request_id="r2", api=api))
    data = json.loads(event.data)
    if api is Api.OPENAI:
        assert event.event == "message" and data["error"]["code"] == "upstream_dropped"
    elif api is Api.RESPONSES:
        assert event.event == "error" and data["type"] == "error"
        assert data["code"] == "upstream_dropped" and "r2" in data["message"]
    else:
        assert event.event == "error"
        assert data == {
            "type": "error",
            "error": {"type": "api_error", "message": "the engine's answer broke off (request r2)"},
        }
