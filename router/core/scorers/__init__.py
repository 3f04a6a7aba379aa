"""Scorers: each maps a decision's candidates to scores in [0, 1], one per candidate in order
(the tests check the range on arbitrary inputs); a policy adds them up by weight.

Modules:

- ``base``: the ``Inputs`` of one decision, the ``ScorerType`` record, params with their
  defaults and limits (``param``, ``read_params``), and ``Memory`` for a scorer that remembers.
- ``registry``: ``SCORERS``, every type by its kebab-case name; adding a scorer is one module
  here plus one line there.
- One module per type, each with ``NAME``, ``Params``, ``parse``, ``score`` and ``TYPE``:
  ``prefix_overlap``, ``prefill_cost``, ``ttft_estimate``, ``load``, ``session_affinity``
  (which also owns the session map and how a request names its session).
"""
