"""The pure routing core: no I/O, no clock it was not handed.

Modules, from the request inwards:

- ``blocks``: an OpenAI request body -> canonical routing text -> chained block keys; the
  token-exact keys of token ids, at an engine's block size. ``chat_form``: Responses and
  Messages bodies in the chat-completions form that ``blocks`` reads.
- ``lru``: a recency-ordered key set with bounded size; the eviction model shared by the
  router's index and the simulated engines' prefix caches.
- ``index``: which engine holds which block keys, expressed as mergeable deltas; ``seq``: the
  bounded window of sequence numbers seen per origin.
- ``predictions``: which index entries are provisional (an attempt awaiting its first byte).
- ``ring``: consistent hashing with bounded loads, for prefixes nobody holds yet, and the
  bounded-load cap that filters candidates.
- ``load``: in-flight requests and prompt tokens per engine: local, in peer reports, and in the
  engines' own reports.
- ``kv_events``: engines' KV cache events, the vLLM/SGLang wire format decoded into values;
  ``engine_blocks``: one engine's events -> index changes in token-exact keys;
  ``precise``: overlaps of the engines whose events are complete, in the request's units.
- ``fields``: the strict field-by-field reader behind policy and config loading (text in,
  values out: the shell reads the files, ``router.yaml_files``).
- ``policy``: the YAML policy model with strict loading.
- ``scorers``: one module per scorer type (params, parse, score) and the registry by
  kebab-case name; ``pickers``: the pickers, registered the same way.
- ``decision``: ``RoutingCore``, the one decision the gateway and the simulator both call
  (``decide``, a query) and the named state changes around it (``acquire``, ``record``,
  ``release``, ``forget``); ``verdict``: the ``Decision`` it returns, with what it says of
  routing quality; ``shortlist``: which candidates a large fleet's decision scores;
  ``turns``: conversations' previous turns, to say where a follow-up's prefix broke.
- ``disaggregation``: engine roles (prefill, decode, both) and the per-request choice between
  running a request whole and splitting its prefill off, priced by the KV transfer.
- ``response_homes``: which engine stored which response, for stateful Responses requests.
- ``engine_sizes``: the cache sizes engines report, as the index's capacity for each;
  ``token_scale``: how many of the router's tokens an engine's token is, learnt from usage,
  to read those sizes.
- ``admission``: the order of the gateway's bounded wait queue, by priority and fair between
  tenants; ``retry_budget``: retries in flight as a bounded share of requests in flight.
- ``engine_model``: an engine's prefix cache and timing, for the simulator and engine-sim.
- ``workload``: trace records and synthetic workloads for the simulator; ``agent_workload``: a
  tool-calling agent's conversation in each API's shape (chat, Responses, Messages).
- ``simulator``: discrete-event replay of a trace through ``decision``; ``stats``: percentiles.
- ``pd_simulator``: the same replay through prefill/decode fleets of one size, with the KV
  transfer timed and goodput at a TTFT and a TPOT objective; ``pd_deciders``: who decides
  each request's path there (aggregated, ``disaggregation``, always split, a fixed threshold).
- ``hotpath``: which implementation runs the decision's per-block and per-engine loops: the
  compiled ``_hotpath`` (C, ``hotpath-c/hotpath.c``, built by ``pip install`` where a C
  compiler exists; its stub ``_hotpath.pyi``), or the pure-Python reference each of ``blocks``,
  ``lru``, ``index``, ``predictions``, ``shortlist``, ``ring``, ``scorers`` and ``pickers``
  keeps (``KVROUTER_PURE_PYTHON=1`` forces it).
"""
