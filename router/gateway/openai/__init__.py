"""The protocols the gateway speaks (OpenAI's, and Anthropic's Messages), with no I/O.

- ``request``: an inbound request: the body parsed once, the few fields routing needs, checked;
  Responses and Messages bodies read in the chat form (router.core.chat_form).
- ``errors``: the gateway's exception tree, and the one place that renders any of them in
  OpenAI's error shape (or vLLM's, for engine-sim; Anthropic's, on its routes).
- ``sse``: Server-Sent Events framing: bytes in, events out; values in, bytes out.

It imports nothing else of the gateway, so engine-sim and every other package can use it.
"""
