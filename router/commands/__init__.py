"""The ``kvrouter`` subcommands (dispatched by ``router.cli``), each ``add_arguments`` + ``run``:

- ``serve``: the gateway (router.gateway) in front of OpenAI-compatible engines.
- ``simulate``: replay a trace through the routing core offline (``traces`` reads the files;
  ``pd_options``: its prefill/decode fleets' options and table).
- ``policy``: ``policy check``, validate policy files before they go live.
- ``top``: a live table of the fleet in a terminal, from the routers' public endpoints;
  ``top_model`` computes what it shows (no I/O).
- ``demo``: simulated engines and the gateway as real processes, round-robin against kv-aware;
  ``demo_kv_events`` is its ``--kv-events`` mode, and ``demo_workload`` what both modes share
  (engines, workload, client, tables).

``fleet`` is no subcommand: real kvrouter processes on loopback (free ports, start, wait until
ready, always stopped), for the demo, the integration tests and the benchmarks.

``engine-sim`` lives with the simulated engine, in router.enginesim.
"""
