"""Reading a client's request body: bounded in size and in time.

The size bound is ``limits.max_body_bytes`` (a declared length over it is refused before a byte
is read); the time bound stops a client trickling its body from holding a handler forever.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from router.gateway.openai.errors import BodyTimeout, BodyTooLarge

# A client trickling its body must not hold a handler forever; 16 MiB at 1 MB/s fits.
BODY_READ_SECONDS = 60.0


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes; raises ``BodyTooLarge`` or ``BodyTimeout``."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"request body is larger than {limit} bytes")
    try:
        if request.content.is_eof():
            # The whole body came with the head (most requests): nothing to wait for, and no
            # timer to arm and cancel.
            return await request.read()
        async with asyncio.timeout(BODY_READ_SECONDS):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"request body is larger than {limit} bytes") from None
    except TimeoutError:
        msg = f"the request body did not arrive within {BODY_READ_SECONDS:g}s"
        raise BodyTimeout(msg) from None
