"""A split request under vLLM's protocol: the prefill engine first, then the decode engine.

The prefill request (``wire.vllm_prefill``) is read whole (router.gateway.disagg.prefill); its
lease charges the prompt to the prefill engine and records it there at its answer. Then the
client's request goes to the decode engine with the ``kv_transfer_params`` the prefill engine
answered (``wire.vllm_decode``), through the exchange's own attempts: leased with
``prefills=False`` (its blocks arrive by transfer), recorded at its first byte, relayed
(streamed or not) with the protocol's fields stripped (router.gateway.disagg.answers), and
retried on the decode plan's next engine with the same ``kv_transfer_params`` (the prefill
engine still holds the blocks for whichever engine asks). A prefill engine that answered no
``kv_transfer_params`` leaves the decode engine a plain request, leased as one.

A prefill engine that fails before answering costs the request nothing but the attempt: it
runs whole, on the decode engine or the next that can answer alone (``whole_plan``), after
the retry budget's say, as any retry; the failure is counted and blamed as any attempt's. A
prefill engine's 4xx is its verdict on the request, relayed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from router.core.disaggregation import Disaggregated, DisaggSettings
from router.gateway.disagg import wire
from router.gateway.disagg.answers import StrippingUpstream
from router.gateway.disagg.prefill import Exchanging, Prefill, Suspects, refusal
from router.gateway.openai.errors import UpstreamError

log = logging.getLogger(__name__)


async def run(
    ex: Exchanging,
    split: Disaggregated,
    rules: DisaggSettings,
    client: Mapping[str, Any],
    raw: bytes,
    headers: Sequence[tuple[str, str]],
    suspects: Suspects,
) -> web.StreamResponse:
    """Prefill on ``split.prefill_engine``, then decode on ``split.engine`` (or its plan)."""
    s = ex.s
    p, pd, dd = split.prefill_engine, split.prefill, split.decode
    assert p is not None and pd is not None and dd is not None, "a split names both sides"
    limit = max(1, s.limits.max_attempts)
    ex.receipt.attempt(p, 1)
    body = orjson.dumps(wire.vllm_prefill(client))
    lease = s.core.acquire(pd, p, s.clock())
    try:
        answer = await Prefill(ex).run(lease, body, [*headers, *ex.trace.attempt(p, 1)])
    except UpstreamError as e:
        ex.trace.attempt_end(e.label)
        log.warning("%s %s: prefill at %s failed: %s; running it whole", ex.id, ex.route, p, e)
        # As any attempt: blamed on the engine at once unless the request may be at fault.
        ex._failed(p, e, blame=not e.request_shaped)
        if e.request_shaped:
            suspects.append((p, e))
        return await _whole(ex, split, rules, raw, headers, suspects, e)
    finally:
        s.core.release(lease)
    ex.trace.attempt_end(str(answer.status))
    if answer.status != 200:
        return refusal(ex, answer)
    answered = wire.transfer_params(answer.body)
    body = orjson.dumps(wire.vllm_decode(client, answered))
    return await ex._attempts(
        dd,
        dd.plan()[:limit],
        body,
        headers,
        suspects,
        prefills=answered is None,
        upstream=StrippingUpstream(s.upstream),
    )


async def _whole(
    ex: Exchanging,
    split: Disaggregated,
    rules: DisaggSettings,
    raw: bytes,
    headers: Sequence[tuple[str, str]],
    suspects: Suspects,
    error: UpstreamError,
) -> web.StreamResponse:
    """The client's request run whole after its prefill engine failed: on the decode plan's
    engines that answer alone, then on the prefill plan's others."""
    s = ex.s
    roles = s.roles()
    plan: list[str] = []
    for d in (split.decode, split.prefill):
        for e in d.plan() if d is not None else ():
            alone = rules.serves_whole(roles.get(e, "both"))
            if alone and e != split.prefill_engine and e not in plan:
                plan.append(e)
    plan = plan[: s.limits.max_attempts - 1]  # the prefill was the first attempt
    d = split.decode or split.prefill
    if not plan or d is None:
        ex._blame(suspects)  # nobody else is asked, as after any last attempt
        raise error
    await ex._before_retry(2, plan[0])
    upstream = StrippingUpstream(s.upstream)
    return await ex._attempts(d, plan, raw, headers, suspects, upstream=upstream)
