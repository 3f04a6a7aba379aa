"""The gateway's exceptions, and the one place that turns any of them into an API's error.

Every refusal and failure leaves the gateway in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}`` (or Anthropic's, on its routes), or, once a
stream has started, as one error event before the stream closes. Lower layers raise these
classes; the upstream seam maps socket and HTTP framing failures into them in one table
(``router.gateway.upstream.client``'s ``EXCEPTION_MAP``); ``error_response`` and
``error_middleware`` below are the only code that renders them, and ``raw_response`` renders the
few refusals made on a connection before aiohttp has a request to answer
(``router.gateway.inbound.connections``). An unexpected exception is logged with its stack trace
and answered with a plain 500 that says nothing about the inside.

The renderers take a ``dialect``: how ``type`` and ``code`` are spelled. The gateway speaks
OpenAI's (``openai_dialect``: ``invalid_request_error``, a string code or null); engine-sim
answers like vLLM (``vllm_dialect``: ``BadRequestError``, the HTTP status as the code). They
also take the ``Api`` the request came by (``api_of`` its path), which shapes the envelope:
OpenAI's for chat, completions and embeddings; for Responses the same body, but a stream ends
with its ``error`` event (``{"type": "error", "code", "message", "param"}``); for Anthropic's
Messages ``{"type": "error", "error": {"type", "message"}}`` in the body and in an ``error``
event, its type named by the status (``ANTHROPIC_TYPES``) whatever the dialect.

    GatewayError                    status, type, code; ``param`` names the field at fault
    ├── RequestError                the client's request is at fault (4xx, never retried)
    │   ├── BadRequest              400  malformed JSON, a wrong or missing field, bad HTTP
    │   ├── Unauthorized            401  admin endpoint without the right bearer token
    │   ├── NotFound                404  unknown model, unknown route
    │   ├── BodyTimeout             408  the body did not arrive in time
    │   ├── HeaderTimeout           408  the request's headers did not arrive in time
    │   ├── BodyTooLarge            413  body above limits.max_body_bytes
    │   ├── EngineRefused           4xx  an engine refused it with a body that is no JSON error
    │   └── EngineVerdict           4xx  an engine refused it and said why (its message, cut)
    ├── InvalidApiKey               401  no or unknown client API key (router.gateway.inbound.auth)
    ├── NoEngine                    503  no healthy engine serves the model (Retry-After)
    ├── TooManyConnections          503  limits.max_connections are open (Retry-After)
    ├── TooBusy                     429  the fleet is full and the wait queue too (Retry-After)
    ├── ShuttingDown                503  the gateway's stop ended its grace period (Retry-After)
    ├── ResponseTooLarge            502  a non-streamed answer above the relay's buffer limit
    ├── UpstreamError               one attempt at an engine failed (retried before 1st byte)
    │   ├── UpstreamConnectError    502  refused, reset or unresolvable before a response
    │   ├── UpstreamDropped         502  the connection broke while reading the response
    │   ├── UpstreamTimeout         504
    │   │   ├── FirstByteTimeout         no body byte within timeouts.first_byte_seconds
    │   │   └── IdleStreamTimeout        no byte within timeouts.idle_stream_seconds
    │   └── UpstreamStatus          502  the engine answered 5xx (its body stays in the log)
    └── InjectedFault               4xx, 5xx  engine-sim's ``POST /fault`` (router.enginesim.faults)

Nothing internal reaches a client in an error: an engine's failure is answered with a generic
message per kind (``UpstreamError.public``) and the request's id, which the log lines that carry
the engine's address and the details also carry; an engine's own 5xx body is never relayed.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from router.gateway.openai import sse

log = logging.getLogger(__name__)

# Retry-After on a 503 when no engine can take a request: about one health-probe interval.
RETRY_AFTER_SECONDS = 2


class GatewayError(Exception):
    """An error with the HTTP status and OpenAI error fields the gateway answers it with."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class RequestError(GatewayError):
    """The client's request is at fault."""

    status = 400
    type = "invalid_request_error"


class BadRequest(RequestError):
    status = 400


class Unauthorized(RequestError):
    status = 401
    type = "authentication_error"
    code = "invalid_admin_token"


class NotFound(RequestError):
    status = 404


class BodyTimeout(RequestError):
    status = 408
    code = "request_timeout"


class HeaderTimeout(RequestError):
    status = 408
    code = "request_header_timeout"


class EngineRefused(RequestError):
    """An engine refused the request (a 4xx) with a body that is no JSON error: its status
    reaches the client in OpenAI's shape, the body (an HTML page from a proxy, a path) only
    the log."""

    code = "upstream_refused"

    def __init__(self, status: int) -> None:
        super().__init__(f"the engine refused the request with status {status}")
        self.status = status


class EngineVerdict(RequestError):
    """An engine refused the request (a 4xx) and said why: its message (cut before anything
    internal, router.gateway.upstream.engine_errors), type and code reach the client in the
    route's API shape, with the engine's status."""

    code = None

    def __init__(self, status: int, message: str, type_: str | None, code: str | int | None):
        super().__init__(message, code=None if code is None else str(code))
        self.status = status
        if type_:
            self.type = type_


class BodyTooLarge(RequestError):
    status = 413
    code = "request_too_large"


class NoEngine(GatewayError):
    status = 503
    code = "no_backend_available"


class TooBusy(GatewayError):
    """Flow control turned the request away: the queue is full, or it waited too long."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(GatewayError):
    """The gateway's grace period ended with this request unanswered
    (router.gateway.runtime.drain)."""

    status = 503
    code = "server_shutting_down"


class TooManyConnections(GatewayError):
    status = 503
    code = "too_many_connections"


class ResponseTooLarge(GatewayError):
    """An engine's non-streamed answer is too large to buffer (not retried: it would recur)."""

    status = 502
    code = "upstream_response_too_large"


class UpstreamError(GatewayError):
    """One attempt at an engine failed; ``engine`` is the engine's base URL."""

    status = 502
    code = "upstream_error"
    # Label of kvrouter_backend_requests_total{code} for a failure that has no HTTP status.
    label = "error"
    # Could the request itself have caused it (a 5xx, a timeout, a dropped answer)? Then one
    # failure says nothing of the engine's health until another engine answers the request.
    request_shaped = True
    # What the client is told: no engine address, no OS error text.
    public = "the engine failed to answer"

    def __init__(self, message: str, engine: str = "") -> None:
        super().__init__(message)
        self.engine = engine


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"
    request_shaped = False  # no request reached the engine
    public = "no engine could be reached"


class UpstreamDropped(UpstreamError):
    code = "upstream_dropped"
    public = "the engine's answer broke off"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    label = "timeout"
    public = "the engine did not answer in time"


class FirstByteTimeout(UpstreamTimeout):
    pass


class IdleStreamTimeout(UpstreamTimeout):
    pass


class UpstreamStatus(UpstreamError):
    """The engine answered with a 5xx status: the client gets a 502, the log the details."""

    def __init__(self, engine: str, status: int, body: bytes, content_type: str) -> None:
        super().__init__(f"engine answered {status}", engine)
        self.engine_status = status
        self.label = str(status)
        self.body = body
        self.content_type = content_type


# (status, type, code) -> the (type, code) an error is answered with.
Dialect = Callable[[int, str, str | None], tuple[str, int | str | None]]


def openai_dialect(status: int, type_: str, code: str | None) -> tuple[str, int | str | None]:
    """OpenAI's spelling, the gateway's own: the type and code as the error class sets them."""
    return type_, code


def vllm_dialect(status: int, type_: str, code: str | None) -> tuple[str, int | str | None]:
    """vLLM's spelling: the type names the exception class of the status, the code is the status."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error", status
    name = "".join(w.capitalize() for w in phrase.replace("-", " ").split())
    return (name if name.endswith("Error") else name + "Error"), status


class Api(enum.Enum):
    """The front door a request came by; its errors take that API's shape."""

    OPENAI = "openai"
    RESPONSES = "responses"
    ANTHROPIC = "anthropic"


def api_of(path: str) -> Api:
    """The API a request path belongs to."""
    if path.startswith("/v1/messages"):
        return Api.ANTHROPIC
    if path.startswith("/v1/responses"):
        return Api.RESPONSES
    return Api.OPENAI


# Anthropic's error type for each status; any other 4xx is invalid_request_error, 5xx api_error.
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _anthropic_error(status: int, message: str) -> dict[str, Any]:
    fallback = "invalid_request_error" if status < 500 else "api_error"
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_TYPES.get(status, fallback), "message": message},
    }


def _json_error(
    status: int,
    message: str,
    type_: str,
    param: str | None,
    code: str | None,
    dialect: Dialect,
    api: Api = Api.OPENAI,
) -> bytes:
    if api is Api.ANTHROPIC:
        return orjson.dumps(_anthropic_error(status, message))
    type_out, code_out = dialect(status, type_, code)
    error = {"message": message, "type": type_out, "param": param, "code": code_out}
    return orjson.dumps({"error": error})


# aiohttp raises these itself (routing, body limit); they get the same shape as ours.
_HTTP_MESSAGES: dict[int, tuple[str, str | None]] = {
    404: ("no route for {method} {path}", "not_found"),
    405: ("method {method} is not allowed on {path}", "method_not_allowed"),
    413: ("request body is larger than {limit} bytes", "request_too_large"),
}


def error_response(
    exc: BaseException,
    *,
    method: str = "",
    path: str = "",
    body_limit: int = 0,
    dialect: Dialect = openai_dialect,
    request_id: str = "",
    api: Api = Api.OPENAI,
) -> web.Response:
    """The HTTP response for ``exc`` (any exception; unexpected ones become a bare 500), in the
    shape of ``api``.

    With ``request_id``, a server-side error's message names it (the log lines about the
    request carry it too) and the response carries it as X-Request-Id.
    """
    headers: dict[str, str] = {}
    if request_id:
        headers["X-Request-Id"] = request_id
    if isinstance(exc, GatewayError):
        status, message, type_, param, code = (
            exc.status,
            exc.public if isinstance(exc, UpstreamError) else exc.message,
            exc.type,
            exc.param,
            exc.code,
        )
        if isinstance(exc, NoEngine | ShuttingDown):
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        elif isinstance(exc, TooBusy):
            headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, web.HTTPException) and exc.status >= 400:
        status = exc.status
        template, code = _HTTP_MESSAGES.get(status, (exc.reason, None))
        message = template.format(method=method, path=path, limit=body_limit)
        type_, param = "invalid_request_error" if status < 500 else "server_error", None
        if "Allow" in exc.headers:
            headers["Allow"] = exc.headers["Allow"]
    else:
        status, message, type_, param, code = 500, "internal error", "server_error", None, None
    if request_id and status >= 500:
        message = f"{message} (request {request_id})"
    headers["Content-Type"] = "application/json"
    body = _json_error(status, message, type_, param, code, dialect, api)
    return web.Response(status=status, body=body, headers=headers)


def raw_response(exc: GatewayError, dialect: Dialect = openai_dialect) -> bytes:
    """The bytes of a whole HTTP/1.1 response for ``exc``, which closes the connection.

    For refusals made where aiohttp has no request to answer: a connection over the cap, a
    request head that never arrived, one that cannot be parsed.
    """
    body = _json_error(exc.status, exc.message, exc.type, exc.param, exc.code, dialect)
    head = [
        f"HTTP/1.1 {exc.status} {HTTPStatus(exc.status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if isinstance(exc, TooManyConnections):
        head.append(f"Retry-After: {RETRY_AFTER_SECONDS}")
    return "\r\n".join([*head, "", ""]).encode("ascii") + body


def stream_error(
    exc: BaseException,
    dialect: Dialect = openai_dialect,
    request_id: str = "",
    api: Api = Api.OPENAI,
) -> bytes:
    """The SSE error event that ends a stream that failed after its first byte, in ``api``'s
    shape."""
    if isinstance(exc, GatewayError):
        message = exc.public if isinstance(exc, UpstreamError) else exc.message
        status, type_, code = exc.status, exc.type, exc.code
    else:
        status, message, type_, code = 500, "internal error", "server_error", None
    if request_id:
        message = f"{message} (request {request_id})"
    if api is Api.ANTHROPIC:
        return sse.encode(orjson.dumps(_anthropic_error(status, message)), "error")
    type_out, code_out = dialect(status, type_, code)
    if api is Api.RESPONSES:
        event = {"type": "error", "code": code_out or type_out, "message": message, "param": None}
        return sse.encode(orjson.dumps(event), "error")
    return sse.error_event(message, type_out, code_out)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_middleware(body_limit: int, dialect: Dialect = openai_dialect) -> Middleware:
    """Middleware answering every exception in its API's shape, never with a stack trace."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(
                exc,
                method=request.method,
                path=request.path,
                body_limit=body_limit,
                dialect=dialect,
                api=api_of(request.path),
            )
        except GatewayError as exc:
            return error_response(exc, dialect=dialect, api=api_of(request.path))
        except Exception as exc:
            log.exception("unexpected error on %s %s", request.method, request.path)
            return error_response(exc, dialect=dialect, api=api_of(request.path))

    return middleware
