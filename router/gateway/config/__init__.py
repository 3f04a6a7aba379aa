"""The gateway's configuration: the file, the flags that override it, and what is read at start.

- ``settings``: the config file's model (every field with its default in the docstring) and its
  strict loader; the ``listen``, ``policy_reload`` and ``health`` sections.
- ``serving``: the sections that say how a request is served: ``timeouts``, ``limits``, ``auth``,
  ``forwarding``, ``drain`` and ``flow_control``.
- ``engines``: the ``engines`` and ``engine_metrics`` sections.
- ``pods``: ``engines.pods``, engines found as the Kubernetes pods a label selector picks.
- ``gossip``: the ``gossip`` section.
- ``models``: the ``models`` section: model aliases and patterns, and the request rewritten to
  the served name.
- ``tracing``: the ``tracing`` section, and the standard ``OTEL_*`` variables over it;
  ``otlp_delivery``: the exporter's and batching's variables (headers, TLS, timeouts, batches).
- ``epp``: the ``epp`` section (the endpoint picker) and its flags.
- ``disaggregation``: the ``disaggregation`` section: the prefill/decode wire protocol, the
  link and the model's KV size.
- ``access_log``: the ``access_log`` section.
- ``overrides``: the command-line flags, applied over the file's values.
- ``engine_keys``: the API key each engine is sent, read from the environment once.
- ``reload``: hot reload of the policy file, and of the config file's ``models`` section.
"""
