"""The request id: what names a request in client-facing errors, log lines and engine calls.

A client's own ``X-Request-Id`` is kept when it is a short plain token, else a fresh one is
made; every answer to a generation request carries it back.
"""

from __future__ import annotations

import re
import secrets

from aiohttp import web

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
REQUEST_ID = web.RequestKey("kvrouter.request_id", str)


def request_id(given: str) -> str:
    """The request's id: ``given`` when it is a short plain token, else a fresh random one."""
    return given if _REQUEST_ID.fullmatch(given) else secrets.token_hex(8)


async def id_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer to a generation request says its request id."""
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers["X-Request-Id"] = rid
