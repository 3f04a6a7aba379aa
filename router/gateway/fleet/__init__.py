"""The fleet of engines as the gateway sees it.

- ``pool``: which engines exist (static URLs, a DNS name re-resolved), which are healthy, and
  which models each serves.
- ``pods``: engines from the Kubernetes API, the Ready pods a label selector picks.
- ``scrape``: the load engines report of themselves, scraped from their /metrics and parsed.
"""
