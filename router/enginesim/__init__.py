"""``kvrouter engine-sim``: a simulated OpenAI-compatible engine with a real prefix cache.

One process is one engine. It answers the OpenAI surface the gateway proxies, framed like
vLLM's OpenAI server, and exports vLLM's metric names, so the gateway, the demo and the
benchmarks can treat it as a real engine. Behind the HTTP surface is the engine model the
offline simulator uses (``router.core.engine_model``), counted in the router's own token unit:
a result in simulation is one the live demo can reproduce.

Modules, from the request inwards:

- ``requests``: an inbound body -> what the engine needs (the gateway's parsing and errors,
  plus the fields only an engine reads), and ``/fault`` bodies.
- ``tokens``: a prompt -> its token count and cache-block keys, in the router's unit
  (``CHARS_PER_TOKEN`` characters per token); the output vocabulary.
- ``engine``: the state of one engine: prefix cache, clock, counters, in-flight requests and
  the pending fault.
- ``responses``: generation streams and bodies, embeddings and the model list, as vLLM shapes
  them.
- ``cancel``: what stops a request before its end (a closed connection, SGLang's abort by
  rid), and the tokens generated after the client left.
- ``api_replies``: the Responses and Messages answers, in those APIs' shapes and events;
  ``stored``: the responses stored for ``previous_response_id``.
- ``metrics``: vLLM's metric names for ``/metrics``.
- ``kv_publisher``: the prefix cache's stores and evictions published as vLLM's KV cache
  events, with replay.
- ``disagg``: the engine's side of a disaggregated request (``--role``) and its wait for the
  other engine; ``disagg_wire``: the fields vLLM's ``kv_transfer_params`` and SGLang's bootstrap
  carry, and the role's settings; ``disagg_vllm``: a prefill's blocks held for pulling, and
  the pull; ``disagg_sglang``: the bootstrap server where both sides of a room meet.
- ``app``: the aiohttp app: routes, pacing of streams, ``/stats`` and ``/reset``; ``app_keys``:
  the typed keys of the state it holds; ``faults``: the injected faults of ``/fault`` and the
  aborts (a reset connection, ``/abort_request``).
- ``cli``: the ``engine-sim`` subcommand's options and process.
- ``model_files``: a simulated model's tokenizer files (a small BPE trained on a fixed corpus
  and a ChatML template), for a local tokenizer where no real model can be downloaded.
"""
