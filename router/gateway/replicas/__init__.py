"""This gateway as one replica of a fleet of routers that gossip their index and load.

- ``replica``: membership: the gossip node a gateway runs, started and stopped with the app.
- ``node_config``: the gossip node's config, built from the config file and the environment
  (one replica's, and each ``--workers`` process's).
- ``delegate``: the router's gossip delegate: the block index and load book behind a node.
- ``in_process``: many replicas in one process over gossip's in-memory network, each what a
  gateway runs minus the HTTP (for tests and the convergence benchmark, as gossip's own
  in-memory transport is).
"""
