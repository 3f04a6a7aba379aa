"""The gateway's configuration: the file, the flags that override it, and what is read at start.

- ``settings``: the config file's model (every field with its default in the docstring) and its
  strict loader; the ``listen``, ``policy_reload`` and ``health`` sections.
- ``serving``: the sections that say how a request is served: ``timeouts``, ``limits``, ``auth``,
  ``forwarding``, ``drain`` and ``flow_control``.
- ``engines``: the ``engines`` and ``engine_metrics`` sections.
- ``gossip``: the ``gossip`` section.
- ``access_log``: the ``access_log`` section.
- ``overrides``: the command-line flags, applied over the file's values.
- ``engine_keys``: the API key each engine is sent, read from the environment once.
- ``reload``: hot reload of the policy file.
"""
