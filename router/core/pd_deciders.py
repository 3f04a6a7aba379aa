"""Who decides a request's path in a simulated fleet: kvrouter's rule and the peers' rules.

Each decider answers with a ``disaggregation.Disaggregated`` (the path, the answering engine and,
split, the prefill engine), so the simulator drives every fleet's requests the same way:

- ``aggregated``: every engine does both; ``RoutingCore.decide`` picks one, the request runs
  whole (kvrouter without disaggregation: the baseline).
- ``kvrouter``: ``disaggregation.decide`` with ``decider: cost``, the gateway's default: the
  decode engine first, then whole or split, whichever is estimated quicker, the link priced.
- ``always-split``: ``decider: always``, every request split, the decode engine picked first
  and then the prefill engine (SGLang's model gateway in its PD mode; Dynamo once a prefill
  worker registers).
- ``threshold``: ``decider: threshold``, llm-d's rule (its ``prefix-based-pd-decider``): split
  when the decode engine lacks more than ``threshold_tokens`` of the prompt, else whole there.
  Its ``nonCachedTokens`` defaults to 0 in code (always split); llm-d's P/D guide configures
  16, the simulator's default.

All four are the decision code the gateway runs, with the setting an operator would give it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.core.decision import RoutingCore
from router.core.disaggregation import Decider, Disaggregated, DisaggSettings, Role, decide

# llm-d's P/D guide: ``prefix-based-pd-decider`` with ``nonCachedTokens: 16``.
LLMD_THRESHOLD_TOKENS = 16

FLEETS = ("aggregated", "kvrouter", "always-split", "threshold")

Rule = Callable[
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


# The gateway's ``decider`` setting behind each simulated fleet that disaggregates.
_SETTING: dict[str, Decider] = {
    "kvrouter": "cost",
    "always-split": "always",
    "threshold": "threshold",
}


def decider(name: str, settings: DisaggSettings, threshold_tokens: int) -> Rule:
    """The decider called ``name`` (one of ``FLEETS``) over a link of ``settings``."""
    if name == "aggregated":
        return _aggregated
    if name not in _SETTING:
        raise ValueError(f"no decider {name!r}: one of {', '.join(FLEETS)}")
    fixed = dataclasses.replace(settings, decider=_SETTING[name], threshold_tokens=threshold_tokens)

    def rule(
        core: RoutingCore,
        body: Mapping[str, Any],
        roles: Mapping[str, Role],
        names: Sequence[str],
        now: float,
        session: str | None,
        tokens: int,
    ) -> Disaggregated:
        return decide(core, body, roles, names, now, fixed, session, tokens)

    return rule
