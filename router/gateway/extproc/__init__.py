"""The endpoint picker: this gateway's decisions for an Envoy-based gateway that proxies.

Envoy's ext_proc filter asks, over ``envoy.service.ext_proc.v3.ExternalProcessor``, where each
request goes (the Gateway API Inference Extension's endpoint picker protocol); the answer is
the same core decision the proxy makes (router.gateway.exchange's ``decide``), and the load and
the prefix are taken, recorded and released as the exchange does.

- ``messages``: the protocol over Envoy's protos, no I/O: headers and metadata read, answers
  built (the pick, the body handed back, immediate responses).
- ``stream``: one ext_proc stream's life, from the request's headers to the response's end.
- ``endpoints``: engine URLs as Envoy dials them (``ip:port``), and back.
- ``metrics``: the ``kvrouter_epp_*`` series.
- ``server``: the gRPC server (ext_proc and health) and its background loops.

Import rules (tests/test_architecture.py): only ``runtime`` imports this package; it takes
``Services`` from the wiring, as the exchange does, and never imports ``app``.
"""
