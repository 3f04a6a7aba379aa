"""Flow control in the gateway: a full fleet queues requests, orders them, and answers 429."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.gateway.config.engines import EngineMetricsSettings
from router.gateway.config.serving import FlowControl, Timeouts
from router.gateway.inbound.admission import Admission, priority_of, tenant_of
from router.gateway.openai.errors import BadRequest
from tests.fakes import FakeEngine, Script, openai_answer
from tests.gateway.rig import CHAT, Rig, assert_all_released, chat, rig

A = "http://engine-a:8000"
SLOW = Timeouts(connect_seconds=1, first_byte_seconds=30, idle_stream_seconds=30)


def one_slot(**kw: Any) -> dict[str, Any]:
    """One engine that takes one request at a time."""
    flow = dataclasses.replace(FlowControl(max_inflight_per_engine=1), **kw)
    return {"flow_control": flow, "timeouts": SLOW}


def gated(gate: asyncio.Event, prompt: str = "x") -> Script:
    return dataclasses.replace(openai_answer(chat(prompt)), gate=gate)


async def until(cond: Any, what: str) -> None:
    for _ in range(400):
        if await cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def depth(r: Rig) -> float:
    return await r.metric("kvrouter_queue_depth")


async def test_flow_full_fleet_queues_then_admits_when_a_slot_frees(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot()) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        second = asyncio.create_task(r.post(CHAT, chat("second")))
        await until(lambda: _depth_is(r, 1), "the second request queued")
        assert r.up.sent == [A]  # the full engine got nothing more
        gate.set()
        assert [(await first)[0], (await second)[0]] == [200, 200]
        assert await r.metric("kvrouter_admitted_total", path="queued") == 1
        assert await r.metric("kvrouter_queue_wait_seconds_count") == 1


async def test_flow_queue_full_429_with_retry_after_in_openai_shape(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot(max_queue=1)) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        queued = asyncio.create_task(r.post(CHAT, chat("queued")))
        await until(lambda: _depth_is(r, 1), "one request queued")
        async with r.client.post(CHAT, json=chat("third")) as resp:
            body = await resp.json()
            assert resp.status == 429 and resp.headers["Retry-After"] == "1"
        assert body["error"]["code"] == "rate_limit_exceeded"
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert await r.metric("kvrouter_rejected_total", reason="queue_full") == 1
        gate.set()
        assert [(await first)[0], (await queued)[0]] == [200, 200]


async def test_flow_max_wait_429_never_5xx(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot(max_wait_seconds=0.05)) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        status, body = await r.post(CHAT, chat("late"))
        assert status == 429 and body["error"]["type"] == "rate_limit_error"
        assert await r.metric("kvrouter_rejected_total", reason="timeout") == 1
        gate.set()
        assert (await first)[0] == 200


async def test_flow_priority_then_arrival_order(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot()) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        waiting = []
        for n, (prompt, prio) in enumerate([("batch", "5"), ("normal", "0"), ("urgent", "-1")]):
            hdr = {"x-kvrouter-priority": prio}
            waiting.append(asyncio.create_task(r.post(CHAT, chat(prompt), headers=hdr)))
            await until(lambda n=n: _depth_is(r, n + 1), "queued")
        gate.set()
        assert all(s == 200 for s, _ in [await first, *[await t for t in waiting]])
        order = [q.body for q in r.up.engines[A].requests]
        served = [next(p for p in ("first", "urgent", "normal", "batch") if p.encode() in b)
                  for b in order]  # fmt: skip
        assert served == ["first", "urgent", "normal", "batch"]


async def test_flow_client_leaving_the_queue_leaves_at_once(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot()) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.2)
            await r.client.post(CHAT, json=chat("impatient"), timeout=timeout)
        await until(lambda: _depth_is(r, 0), "the queue empty again")
        assert r.gw.admission.waiting == 0
        gate.set()
        assert (await first)[0] == 200
        # The slot it would have had is not lost: the next request goes straight through.
        assert (await r.post(CHAT, chat("next")))[0] == 200
        await assert_all_released(r)


async def test_flow_no_limits_configured_never_holds_a_request(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), timeouts=SLOW) as r:
        r.up.next(gated(gate), gated(gate))
        tasks = [asyncio.create_task(r.post(CHAT, chat(f"p{i}"))) for i in range(2)]
        await until(lambda: _sent(r, 2), "both requests at the engine")
        gate.set()
        assert [(await t)[0] for t in tasks] == [200, 200]
        assert await r.metric("kvrouter_admitted_total", path="immediate") == 2


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({}, {}, 0),
        ({"priority": -3}, {}, -3),
        ({"priority": 7}, {"x-p": "-1"}, -1),
    ],
)
def test_priority_of_body_then_header(
    body: dict[str, Any], headers: dict[str, str], expected: int
) -> None:
    assert priority_of(body, headers, "x-p") == expected


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"priority": "high"}, {}),
        ({"priority": True}, {}),
        ({}, {"x-p": "1.5"}),
        ({"priority": 10**9}, {}),
    ],
)
def test_priority_of_bad_value_400(body: dict[str, Any], headers: dict[str, str]) -> None:
    with pytest.raises(BadRequest):
        priority_of(body, headers, "x-p")


def test_tenant_of_header_then_key_then_user_digested() -> None:
    assert tenant_of({}, {"x-t": "team-a"}, "x-t") == "team-a"
    by_key = tenant_of({"user": "u"}, {"Authorization": "Bearer sk-secret"}, "x-t")
    assert by_key.startswith("key:") and "sk-secret" not in by_key
    assert tenant_of({"user": "alice"}, {}, "x-t").startswith("user:")
    assert tenant_of({}, {}, "x-t") == "-"


async def _sent(r: Rig, n: int) -> bool:
    return len(r.up.sent) >= n


async def _depth_is(r: Rig, n: int) -> bool:
    return await depth(r) == n


async def _urgent_through_the_reserve(tmp_path: Path) -> None:
    """One engine of two slots, one kept for urgent requests: the first request takes a
    slot, a normal one queues at the reserve, an urgent one reaches the engine."""
    gate = asyncio.Event()
    async with rig(
        tmp_path, FakeEngine(A), **one_slot(max_inflight_per_engine=2, priority_reserve=1)
    ) as r:
        r.up.next(gated(gate), gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        normal = asyncio.create_task(r.post(CHAT, chat("normal")))
        await until(lambda: _depth_is(r, 1), "the normal request queued at the reserve")
        hdr = {"x-kvrouter-priority": "-1"}
        urgent = asyncio.create_task(r.post(CHAT, chat("urgent"), headers=hdr))
        await until(lambda: _sent(r, 2), "the urgent request at the engine")
        assert await depth(r) == 1
        gate.set()
        assert [(await t)[0] for t in (first, normal, urgent)] == [200, 200, 200]


async def test_flow_priority_reserve_lets_urgent_through_a_full_fleet(tmp_path: Path) -> None:
    await _urgent_through_the_reserve(tmp_path)


def vllm_metrics(waiting: int) -> tuple[int, bytes]:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 4\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
    )
    return 200, text.encode()


async def test_flow_engine_reporting_a_queue_holds_requests_until_it_drains(
    tmp_path: Path,
) -> None:
    engine = FakeEngine(A, metrics=vllm_metrics(3))
    scrape = EngineMetricsSettings(interval_seconds=0.02, timeout_seconds=0.5)
    async with rig(tmp_path, engine, engine_metrics=scrape, timeouts=SLOW) as r:
        await until(lambda: _reported_waiting(r, 3), "the engine's queue reported")
        task = asyncio.create_task(r.post(CHAT, chat("held")))
        await until(lambda: _depth_is(r, 1), "the request held in the gateway's queue")
        assert r.up.sent == []
        engine.metrics = vllm_metrics(0)
        assert (await task)[0] == 200
        assert await r.metric("kvrouter_admitted_total", path="queued") == 1


async def _reported_waiting(r: Rig, n: int) -> bool:
    report = r.gw.core.loads.engine_reported(A, r.gw.clock())
    return report is not None and report.waiting == n


async def test_flow_waiter_cancelled_then_dropped_by_pump_leaves_the_cap_intact(
    tmp_path: Path,
) -> None:
    """A waiter whose wait ends (its client left, or max_wait passed) may be dropped by a
    pump before its task runs again; it held no slot and must not free one."""
    gate = asyncio.Event()
    async with rig(tmp_path, FakeEngine(A), **one_slot()) as r:
        r.up.next(gated(gate))
        first = asyncio.create_task(r.post(CHAT, chat("first")))
        await until(lambda: _sent(r, 1), "the first request at the engine")
        adm = r.gw.admission
        leaving = asyncio.create_task(adm.enter([A], 0, "t"))
        await until(lambda: _waiting(adm, 1), "a waiter queued")
        leaving.cancel()  # cancels the future it awaits at once; the task runs later
        adm.pump()  # meanwhile: sees a done future at the head and drops it
        with pytest.raises(asyncio.CancelledError):
            await leaving
        # The engine is still full: the next request must wait, not pass.
        second = asyncio.create_task(r.post(CHAT, chat("second")))
        await until(lambda: _depth_is(r, 1), "the second request queued")
        for _ in range(5):
            adm.pump()
            await asyncio.sleep(0.01)
        assert r.up.sent == [A] and not second.done()
        gate.set()
        assert [(await first)[0], (await second)[0]] == [200, 200]


async def _waiting(adm: Any, n: int) -> bool:
    return bool(adm.waiting == n)


async def test_flow_urgent_request_finding_a_reserved_slot_goes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With others queued, an urgent request that a reserved slot can take goes when it
    arrives: not at the next request's end, nor at the next pump of the timer (off here)."""

    async def no_timer(_self: Admission, interval: float = 0.0) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(Admission, "pump_loop", no_timer)
    await _urgent_through_the_reserve(tmp_path)
