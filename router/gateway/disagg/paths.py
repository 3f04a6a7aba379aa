"""Which path a request takes where prefill and decode may run apart, and the split's start.

Disaggregation applies to the routes both peers' proxies split (``wire.SPLIT_ROUTES``) once
some engine's role is not ``both`` (``Services.roles``), under the ``disaggregation``
section's settings (``Services.disaggregation``). There ``decide`` asks the core
(router.core.disaggregation's ``decide``) for the path instead of the aggregated decision;
``taken`` counts it and gives the decision whose engine answers. A whole path runs as any
request, on that decision's plan, kept to the engines that can answer a request by
themselves (``whole_plan``: under SGLang's protocol a prefill or decode server cannot). A
split runs by its protocol (``run``: router.gateway.disagg.vllm, router.gateway.disagg.sglang).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from router.core import disaggregation
from router.core.disaggregation import Disaggregated
from router.core.precise import TokenPrompt
from router.core.verdict import Decision
from router.gateway.disagg import sglang, vllm, wire
from router.gateway.disagg.answers import StrippingUpstream
from router.gateway.disagg.prefill import Exchanging, Suspects
from router.gateway.openai.errors import NoEngine
from router.gateway.openai.request import Inbound
from router.gateway.upstream.client import Upstream
from router.gateway.wiring import Services


def decide(
    s: Services,
    route: str,
    inbound: Inbound,
    headers: Mapping[str, str],
    tokenized: TokenPrompt | None = None,
    within: Collection[str] | None = None,
) -> Disaggregated | None:
    """The core's disaggregated decision for ``inbound`` (None: disaggregation does not apply,
    the aggregated decision does). A query: nothing changes, nothing is counted."""
    roles = s.roles()
    if not roles or route not in wire.SPLIT_ROUTES:
        return None
    cands = s.pool.candidates(inbound.model)
    if within is not None:
        cands = tuple(c for c in cands if c in within)
    if not cands:
        return None  # nobody serves it: the aggregated path says so
    core = s.core
    session = core.session_of(headers, inbound.body)
    rules = s.disaggregation
    return disaggregation.decide(
        core, inbound.text, roles, cands, s.clock(), rules, session, tokenized=tokenized
    )


def taken(s: Services, split: Disaggregated) -> Decision:
    """The decision whose engine answers ``split`` (its engine None: nobody can), counted."""
    s.metrics.disagg.decided(split)
    d = split.decision
    if d is None:
        raise NoEngine("no engine can take the request right now")
    if split.engine is None and d.engine is not None:
        d = dataclasses.replace(d, engine=None)
    return d


def whole_plan(s: Services, d: Decision, limit: int) -> tuple[str, ...]:
    """The engines of ``d``'s plan that answer a request by themselves, at most ``limit``."""
    rules, roles = s.disaggregation, s.roles()
    plan = tuple(e for e in d.plan() if rules.serves_whole(roles.get(e, "both")))[:limit]
    if not plan:  # the core answers whole only where an engine can: no plan is no engine
        raise NoEngine("no engine can take the request right now")
    return plan


def stripping(s: Services) -> Upstream:
    """The upstream whole runs of a disaggregated fleet go through: vLLM's engines answer
    ``"kv_transfer_params": null`` to a plain request as well, and a client never sees it."""
    return StrippingUpstream(s.upstream)


def explain(split: Disaggregated) -> dict[str, Any]:
    """/debug/route's account: the answering decision's, and the disaggregated one's."""
    d = split.decision
    return {**(d.explain() if d is not None else {}), "disaggregation": split.explain()}


async def run(
    ex: Exchanging,
    split: Disaggregated,
    raw: bytes,
    headers: Sequence[tuple[str, str]],
    suspects: Suspects,
) -> web.StreamResponse:
    """Serve a split request by its protocol."""
    client = orjson.loads(raw)  # a JSON object: the exchange parsed it already
    rules = ex.s.disaggregation
    if rules.protocol == "sglang":
        return await sglang.run(ex, split, client, headers, suspects)
    return await vllm.run(ex, split, rules, client, raw, headers, suspects)
