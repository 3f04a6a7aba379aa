"""The gateway as a process.

- ``serve``: serving one gateway in this process until a signal stops it.
- ``workers``: ``--workers N``: N such processes on one port, routing as one fleet.
- ``drain``: the stop's grace period, kept.
- ``collector``: the garbage collector, set for serving once start-up is done.

The only package that imports router.gateway.app.
"""
