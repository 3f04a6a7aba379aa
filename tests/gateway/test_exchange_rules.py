"""The exchange's retry and record rules as a table, over ``FakeUpstream`` and no server.

An ``Exchange`` is built over a mocked aiohttp request and the ``Services`` of a ``Gateway``
whose engines are probed by hand: each row says what the engines answer in turn, and what
follows from it: the client's status, how many engines were tried, which one the prompt's
blocks are recorded for (only on a 200's first byte), which failures count against an
engine's health, and the retries spent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from router.gateway.exchange import Exchange
from router.gateway.wiring import Gateway
from tests.fakes import FakeEngine, FakeUpstream, Script, error_answer
from tests.gateway.rig import CHAT, POLICY, A, B, C, chat, config
from tests.support import metric_in


@dataclass(frozen=True)
class Rule:
    answers: tuple[Script, ...]  # what the engines answer, attempt by attempt (then normally)
    status: int  # what the client gets
    tried: int  # engines the request was sent to
    recorded: int | None  # the attempt whose engine holds the prompt's blocks after; None: none
    blamed: tuple[int, ...]  # attempts whose engine had a failure counted against its health
    retries: int


HTML = {"Content-Type": "text/html"}
RULES = {
    "answered-at-once": Rule((), 200, 1, 1, (), 0),
    "5xx-then-answered": Rule((error_answer(503),), 200, 2, 2, (1,), 1),
    "unreachable-then-answered": Rule((Script(connect_error=True),), 200, 2, 2, (1,), 1),
    "5xx-on-two-is-the-requests-fault": Rule(
        (error_answer(500), error_answer(500)), 502, 2, None, (), 1
    ),
    "unreachable-then-5xx-blames-the-first": Rule(
        (Script(connect_error=True), error_answer(500), error_answer(500)), 502, 3, None, (1,), 2
    ),
    "4xx-is-the-engines-verdict": Rule((error_answer(400),), 400, 1, None, (), 0),
    "4xx-without-json-refused-in-shape": Rule(
        (Script(status=404, headers=HTML, chunks=[b"<html>gone</html>"]),), 404, 1, None, (), 0
    ),
}


@asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeUpstream]]:
    """A gateway over three healthy fake engines, its loops not running."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    up = FakeUpstream(FakeEngine(A), FakeEngine(B), FakeEngine(C))
    gw = Gateway(config(A, B, C), policy, upstream=up, environ={})
    await gw.pool.probe_all()
    await gw.pool.refresh_all_models()
    try:
        yield gw, up
    finally:
        await gw.upstream.close()


def posted(body: bytes) -> web.Request:
    """A POST to the chat route carrying ``body``, as aiohttp hands it to a handler."""
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    payload.feed_eof()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return make_mocked_request("POST", CHAT, headers=headers, payload=payload)


@pytest.mark.parametrize("name", list(RULES))
async def test_exchange_rules_retry_record_blame(tmp_path: Path, name: str) -> None:
    rule = RULES[name]
    async with gateway(tmp_path) as (gw, up):
        up.next(*rule.answers)
        body = json.dumps(chat("a prompt long enough for a few full blocks")).encode()
        resp = await Exchange(gw.services, posted(body), CHAT).run()
        assert resp.status == rule.status
        assert len(up.sent) == rule.tried == len(set(up.sent))  # never the same engine twice
        holders = {url for url in (A, B, C) if gw.core.index.blocks(url)}
        assert holders == (set() if rule.recorded is None else {up.sent[rule.recorded - 1]})
        failed = {url for url, e in gw.pool.engines.items() if e.health.failures}
        assert failed == {up.sent[i - 1] for i in rule.blamed}
        assert gw.services.retry_budget.retries == 0  # every retry given back at the end
        retries = metric_in(gw.metrics.exposition().decode(), "kvrouter_retries_total")
        assert retries == rule.retries
        # Nothing leaked: every lease released, every response closed.
        assert gw.core.loads.local_all() == {} and gw.core.outstanding == 0
        assert up.unfinished() == []
