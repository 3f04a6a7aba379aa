"""This gateway as one replica of a fleet of routers that gossip their index and load.

- ``replica``: membership: the gossip node a gateway runs and its settings.
- ``delegate``: the router's gossip delegate: the block index and load book behind a node.
"""
