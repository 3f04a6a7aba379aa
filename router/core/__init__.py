"""The pure routing core: no I/O, no clock it was not handed.

Modules, from the request inwards:

- ``blocks``: an OpenAI request body -> canonical routing text -> chained block keys.
- ``lru``: a recency-ordered key set with bounded size; the eviction model shared by the
  router's index and the simulated engines' prefix caches.
- ``index``: which engine holds which block keys, expressed as mergeable deltas; ``seq``: the
  bounded window of sequence numbers seen per origin.
- ``predictions``: which index entries are provisional (an attempt awaiting its first byte).
- ``ring``: consistent hashing with bounded loads, for prefixes nobody holds yet.
- ``load``: in-flight requests and prompt tokens per engine, local and reported by peers.
- ``kv_events``: engines' KV cache events decoded from the wire, each block keyed the router's
  way (precise mode's truth for the index).
- ``fields``: the strict field-by-field reader behind policy and config loading.
- ``policy``: the YAML policy model with strict loading.
- ``scoring``: filters, scorers and pickers, registered by kebab-case type name.
- ``decision``: ``RoutingCore``, the one decision the gateway and the simulator both call
  (``decide``, a query) and the named state changes around it (``acquire``, ``record``,
  ``release``, ``forget``); ``shortlist``: which candidates a large fleet's decision scores.
- ``admission``: the order waiting requests are admitted in while the fleet is full;
  ``retry_budget``: retries in flight as a bounded share of requests in flight.
- ``engine_model``: an engine's prefix cache and timing, for the simulator and engine-sim.
- ``workload``: trace records and synthetic workloads for the simulator.
- ``simulator``: discrete-event replay of a trace through ``decision``; ``stats``: percentiles.
"""
