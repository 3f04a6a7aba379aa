"""The gateway: the HTTP server in front of the engines, and everything a request touches.

One request, one ``exchange``; the rest serve it:

- ``app``: the aiohttp application, the ``Gateway`` state it serves, the read-only and admin
  routes, and the background loops it owns (each started and stopped by a cleanup context).
- ``exchange``: one request's life in one place: read, parse, admit, decide, then per engine of
  the plan acquire, attempt, record on the first byte, relay, release; ``deadline``: the one
  timer behind an attempt's waits.
- ``flow``: flow control, the bounded fair queue in front of a full fleet; ``auth``: client
  API keys.
- ``inbound``: the request body parsed once, and the few fields routing needs, checked.
- ``upstream``: the one seam to the engines, failures mapped in one place; ``engine_conn``:
  its keep-alive connections and their pool; ``http1``: its request and response framing, no
  I/O.
- ``answer``: how an engine's answer reaches the client (non-streamed ones held only while
  small); ``engine_keys``: the API key each engine is sent; ``drain``: the stop's grace period.
- ``relay``: which headers cross each way, and the ``usage`` read from answers.
- ``sse``: Server-Sent Events framing, no I/O.
- ``errors``: the error tree, and the one place that renders errors in OpenAI's shape.
- ``engines``: the engine pool: static and DNS-discovered engines, health, model lists.
- ``engine_metrics``: scraping the engines' own load; ``kv_events``: subscribing to their KV
  cache events; ``tokenize``: their token ids for a prompt.
- ``metrics``: the Prometheus registry the app owns.
- ``config``: the config file's model, its strict loader and the command-line overrides
  (``config_engines`` and ``config_gossip`` hold those sections).
- ``reload``: hot reload of the policy file.
- ``gossip_delegate`` and ``replicas``: this gateway as one replica of a gossiping fleet.
- ``connections``: client connections: the cap, the header deadline, malformed HTTP.
- ``runtime``: serving one gateway in this process until a signal stops it;
  ``workers``: N such processes on one port; ``eventloop``: uvloop where installed.
"""
