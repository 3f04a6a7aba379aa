"""An engine that misbehaves on request: a raw asyncio HTTP/1.1 server on loopback.

Healthy on ``GET /health``, it serves the model ``bad-model`` and answers every POST with a
small OpenAI chat answer, unless the body names one of the ``MARKS``: then it answers with an
HTML 500 naming an internal path, an HTML 404, bytes that are not HTTP, a connection reset,
nothing for a minute, or a ``HUGE_BYTES`` answer. A raw server, because the misbehaviours are
exactly what an HTTP library will not produce.

    python -m tests.gateway.integration.bad_engine --port P
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct

import orjson

MODEL = "bad-model"
HUGE_BYTES = 48 * 1024 * 1024
MARKS = ("mark:html-500", "mark:html-404", "mark:garbage", "mark:reset", "mark:silent", "mark:huge")
INTERNAL = b"<html><body>upstream /srv/models/secret-weights at 10.9.8.7 failed</body></html>"

_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bad",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


def _response(status: str, ctype: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """(request line, body) of the next request, or None at the connection's end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return lines[0], body


async def _huge(writer: asyncio.StreamWriter) -> None:
    head = b'{"id":"chatcmpl-huge","object":"chat.completion","choices":[{"index":0,'
    head += b'"message":{"role":"assistant","content":"'
    tail = b'"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
    filler = HUGE_BYTES - len(head) - len(tail)
    writer.write(
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {HUGE_BYTES}\r\n\r\n".encode()
        + head
    )
    piece = b"x" * (1024 * 1024)
    for _ in range(filler // len(piece)):
        writer.write(piece)
        await writer.drain()
    writer.write(piece[: filler % len(piece)] + tail)
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while (request := await _read_request(reader)) is not None:
            line, body = request
            if line.startswith("GET /health"):
                writer.write(_response("200 OK", "application/json", b"{}"))
            elif line.startswith("GET /v1/models"):
                models = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                writer.write(_response("200 OK", "application/json", orjson.dumps(models)))
            elif line.startswith("GET "):
                writer.write(_response("404 Not Found", "text/plain", b"no"))
            elif b"mark:html-500" in body:
                writer.write(_response("500 Internal Server Error", "text/html", INTERNAL))
            elif b"mark:html-404" in body:
                writer.write(_response("404 Not Found", "text/html", INTERNAL))
            elif b"mark:garbage" in body:
                writer.write(b"\x00\xffTHIS IS NOT HTTP\r\n\r\n" + INTERNAL)
                await writer.drain()
                break
            elif b"mark:reset" in body:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                break  # closing with linger 0: a reset
            elif b"mark:silent" in body:
                await asyncio.sleep(60)
                break
            elif b"mark:huge" in body:
                await _huge(writer)
            else:
                writer.write(_response("200 OK", "application/json", _ANSWER))
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    asyncio.run(_main(p.parse_args().port))


if __name__ == "__main__":
    main()
