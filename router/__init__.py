"""kvrouter: a KV-cache-aware request router for OpenAI-compatible LLM inference fleets.

- ``core``: the pure routing core (no I/O): block keys, index, ring, load, policies, the
  decision, the simulator.
- ``gateway``: the HTTP gateway in front of the engines (its own map says where things go).
- ``gossip``: the gossip library replicas share their index and load through.
- ``enginesim``: the simulated engine.
- ``commands`` and ``cli``: the ``kvrouter`` command.
- ``hostport``: addresses (HOST:PORT syntax, loopback, free ports); ``presets``: the shipped
  policy files; ``yaml_files``: reading policy and config files (the core parses only text);
  ``eventloop``: uvloop where installed; ``local_tokenizer``: a model's own tokenizer and chat
  template, for the gateway's precise mode and engine-sim alike.
"""

__version__ = "0.1.0"
