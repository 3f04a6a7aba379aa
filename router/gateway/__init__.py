"""The gateway: the HTTP server in front of the engines, and everything a request touches.

One request, one ``exchange``; every sub-package serves it, and each opens with its own map:

- ``exchange``: one request's life in one place: read, parse, admit, decide, then per engine of
  the plan acquire, attempt, record on the first byte, relay, release; ``settle``: how its
  relayed answer ended, counted (usage, the engine's answer or failure, the client's status).
- ``wiring``: the composition root: the ``Gateway`` built from the config (core, engine pool,
  upstream, metrics, admission, precise mode, replica), and the ``Services`` every exchange uses.
- ``app``: the aiohttp application over a ``Gateway``: the generation, read-only and admin
  routes, and the background loops it owns (each started and stopped by a cleanup context).
- ``metrics``: the Prometheus registry the app owns (output; ``fleet.scrape`` is input);
  ``quality``: its routing-quality counters (reached, routed, achieved, why not the deepest).
- ``receipt``: a request's receipt, filled along the exchange and closed once: counted in
  ``quality`` and written as the access log's JSON line; the opt-in route headers.
- ``tracing/``: OpenTelemetry traces of each request (off by default): its spans, recorded and
  sent over OTLP by the router itself, and the W3C trace context each attempt sends its engine.
- ``stored_responses``: a stateful Responses request (``previous_response_id``) goes to the
  engine that stored its response, learnt from the answers.
- ``openai/``: the protocols, no I/O: the request body parsed once (chat, completions,
  embeddings, Responses and Anthropic's Messages), the error tree and its one renderer (in each
  API's shape), Server-Sent Events framing. engine-sim imports only this package of the gateway.
- ``inbound/``: the client's side: connections, API keys, the body read, the request id,
  admission (the fair queue in front of a full fleet).
- ``upstream/``: the engines' side: the one seam (``client``, where lower-layer failures become
  the error tree), its connections and HTTP/1.1 framing, the streamed and held relays of answers
  back to the client, the headers and usage that cross, the attempt's deadline.
- ``fleet/``: which engines exist and how they are: the pool (static, DNS, health, models) and
  the scrape of their own load.
- ``precise/``: precise mode: the engines' KV events, the request's token ids, and which
  engines are precise.
- ``replicas/``: this gateway as one replica of a gossiping fleet.
- ``disagg/``: prefill/decode disaggregation: a request split across a prefill and a decode
  engine, in vLLM's or SGLang's protocol.
- ``extproc/``: the endpoint picker: the same decisions for Envoy's ext_proc filter (the
  Gateway API Inference Extension), over gRPC on its own port.
- ``config/``: the config file's model, strict loading and overrides, the engines' API keys,
  hot reload of the policy file.
- ``runtime/``: the process: serving one gateway until a signal, N workers on one port, the
  stop's grace period.

Where new work goes: a front-door API (another request shape) is parsed in ``openai/`` and
routed by ``app``; a new engine protocol is a new ``upstream/`` client behind the same seam; a
new scorer is a core plugin (router.core), never gateway code.

Import rules (tests/test_architecture.py): ``openai`` imports nothing else of the gateway;
``upstream`` imports only ``openai``; ``fleet`` never imports ``inbound`` or ``exchange``; only
``runtime`` imports ``app``; only ``runtime``, ``app``, ``exchange`` (and its ``settle``),
``disagg`` and ``extproc`` (for ``Services``) import ``wiring``; only ``runtime`` imports
``extproc``.

Words used throughout: an *engine* is one inference server (``backend`` survives only in
released contracts: ``--backend``, ``backends:``, ``/debug/backends``, ``/ready``'s
``healthy_backends``, the ``kvrouter_backend_*`` metrics and their ``backend`` label, and the
``no_backend_available`` error code); a *route* is the URL
path a client called; a *lease* is one attempt's hold on an engine's load and predicted blocks;
a *delta* is a change to the block index, published to replicas; a *report* (an engine report)
is load an engine states of itself, a *peer report* the in-flight load another replica gossips;
*admission* is the queue a request waits in while the fleet is full.
"""
