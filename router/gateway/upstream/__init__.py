"""The engines' side of the gateway: everything sent to an engine and everything it answers.

- ``client``: the one seam, ``Upstream``, and its HTTP implementation; lower-layer failures
  mapped to the error tree there, by one table.
- ``connections``: keep-alive HTTP/1.1 connections to engines and their pool.
- ``http1``: request and response framing, no I/O.
- ``relay``: how an engine's answer reaches the client: the streamed relay and the held one
  (non-streamed answers held only while small), side by side.
- ``headers``: which headers cross each way, and the ``usage`` read from answers.
- ``engine_errors``: an engine's error body reduced to what a client may see (its message,
  never a traceback, a path or an internal name).
- ``deadline``: the one timer behind an attempt's waits: the first byte, then each read.
- ``abort``: telling an engine that a request's client has gone, where a closed connection
  is not enough (SGLang's abort by rid).

It imports only router.gateway.openai from the rest of the gateway.
"""
