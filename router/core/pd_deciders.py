"""Who decides a request's path in a simulated fleet: kvrouter's rule and the peers' rules.

Each decider answers with a ``disaggregation.Disaggregated`` (the path, the answering engine and,
split, the prefill engine), so the simulator drives every fleet's requests the same way:

- ``aggregated``: every engine does both; ``RoutingCore.decide`` picks one, the request runs
  whole (kvrouter without disaggregation: the baseline).
- ``kvrouter``: ``disaggregation.decide``, the decision the gateway calls: the decode engine
  first, then whole or split, whichever is estimated quicker with the transfer priced.
- ``always-split``: every request split, the decode engine picked first and then the prefill
  engine (SGLang's model gateway in its PD mode; Dynamo once a prefill worker registers).
- ``threshold``: llm-d's rule (its ``prefix-based-pd-decider``): split when the prompt tokens
  the decode engine lacks reach ``threshold_tokens``, else whole on the decode engine. Its
  ``nonCachedTokens`` defaults to 0 in code (always split); llm-d's P/D guide configures 16,
  the default here.

The last two reuse the core's two picks (``Disaggregated.decode``, ``.prefill``) and only
override the path, so the fleets differ in the rule and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.core.decision import RoutingCore
from router.core.disaggregation import Disaggregated, DisaggSettings, Role, decide

# llm-d's P/D guide: ``prefix-based-pd-decider`` with ``nonCachedTokens: 16``.
LLMD_THRESHOLD_TOKENS = 16

DECIDERS = ("aggregated", "kvrouter", "always-split", "threshold")

Decider = Callable[
    [RoutingCore, Mapping[str, Any], Mapping[str, Role], Sequence[str], float, str | None, int],
    Disaggregated,
]


def _aggregated(
    core: RoutingCore,
    body: Mapping[str, Any],
    roles: Mapping[str, Role],
    names: Sequence[str],
    now: float,
    session: str | None,
    tokens: int,
) -> Disaggregated:
    d = core.decide(body, names, now, session, tokens)
    return Disaggregated(
        "whole", d.engine, None, "aggregated", d, None, None, None, None, 0, 0, 0.0
    )


def _split(dis: Disaggregated, why: str) -> Disaggregated:
    if dis.decode is None or dis.decode.engine is None:
        return dis
    if dis.prefill is None or dis.prefill.engine is None:
        return dis
    return dataclasses.replace(
        dis, path="split", engine=dis.decode.engine, prefill_engine=dis.prefill.engine, why=why
    )


def _stay(dis: Disaggregated, why: str) -> Disaggregated:
    if dis.decode is None or dis.decode.engine is None:
        return dis
    return dataclasses.replace(dis, path="whole", engine=dis.decode.engine, why=why)


def decider(name: str, settings: DisaggSettings, threshold_tokens: int) -> Decider:
    """The decider called ``name`` (one of ``DECIDERS``) over a link of ``settings``."""
    if name == "aggregated":
        return _aggregated

    def rule(
        core: RoutingCore,
        body: Mapping[str, Any],
        roles: Mapping[str, Role],
        names: Sequence[str],
        now: float,
        session: str | None,
        tokens: int,
    ) -> Disaggregated:
        dis = decide(core, body, roles, names, now, settings, session, tokens)
        if name == "always-split":
            return _split(dis, "always")
        if name == "threshold":
            if dis.transfer_tokens >= threshold_tokens:
                return _split(dis, "above-threshold")
            return _stay(dis, "below-threshold")
        return dis

    if name not in DECIDERS:
        raise ValueError(f"no decider {name!r}: one of {', '.join(DECIDERS)}")
    return rule
