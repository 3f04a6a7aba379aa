"""The endpoint picker driven as Envoy's ext_proc filter drives it (tests.gateway.extproc.
envoy_standin): the pick, both body modes, the subset hint, the response phase, and every way
a stream can go wrong, each ending with all load given back (the rig's exit checks it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.core.token_scale import MIN_REQUESTS
from router.gateway.config.serving import FlowControl
from router.gateway.extproc import messages as msg
from tests.fakes import FakeEngine
from tests.gateway.extproc.envoy_standin import BUFFERED, FULL_DUPLEX, FilterConfig, Mode, Routed
from tests.gateway.extproc.picking import EP_A, EP_B, EP_C, fake_resolve, picking, usage
from tests.gateway.rig import A, B, C, chat
from tests.support import eventually

LONG = "a shared system prompt that spans more than one block of sixteen characters " * 4


def error_of(routed: Routed) -> dict[str, Any]:
    im = routed.immediate
    assert im is not None, routed
    err: dict[str, Any] = orjson.loads(im.body)["error"]
    return err


async def test_picker_full_duplex_names_the_plan_in_header_and_metadata(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG))
        assert routed.immediate is None
        # The header and the metadata carry the same ordered list: the pick, then a fallback.
        assert routed.destination == ",".join(routed.endpoints)
        assert sorted(routed.endpoints) == [EP_A, EP_B]
        assert json.loads(routed.body) == chat(LONG)  # handed back whole in streamed pieces
        assert msg.FAIRNESS not in routed.headers
        assert p.rig.gw.core.outstanding == 1  # the lease is held while Envoy forwards
        answer = {"choices": [], "usage": usage(40, 32)}
        out = await f.respond(200, [orjson.dumps(answer)], served=routed.endpoints[0])
        assert json.loads(out) == answer
        assert p.metric("kvrouter_cached_tokens_total") == 32
        assert p.metric("kvrouter_requests_total", route="/v1/chat/completions", code="200") == 1
        assert p.metric("kvrouter_epp_picks_total", served="pick") == 1
        assert p.metric("kvrouter_epp_decisions_total", mode="full_duplex_streamed") == 1


async def test_picker_records_the_prefix_where_it_was_served(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        first = await p.route(chat(LONG))
        again = await p.route(chat(LONG + " and a follow-up question"))
        assert again.endpoints[0] == first.endpoints[0]


async def test_picker_usage_teaches_the_core_the_engines_token_size(tmp_path: Path) -> None:
    # As the proxy's exchange does: an index sized in engine tokens read as the router's would
    # believe prefixes the engines evicted long ago (or forget ones they hold).
    async with picking(tmp_path) as p:
        for _ in range(MIN_REQUESTS):
            routed = await p.route(chat(LONG))  # the engine counts the prompt as 10 tokens
            assert routed.immediate is None
        d = p.rig.gw.core.decide(chat(LONG), [A], now=0.0)
        assert p.rig.gw.core.sizes.scale.ratio == pytest.approx(d.prompt_tokens / 10, rel=0.06)


async def test_picker_buffered_answers_headers_first_then_picks_on_the_body(
    tmp_path: Path,
) -> None:
    config = FilterConfig(request_body_mode=BUFFERED, response_body_mode=BUFFERED)
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG), config)
        assert routed.immediate is None and routed.endpoints[0] in (EP_A, EP_B)
        assert routed.destination == ",".join(routed.endpoints)
        assert json.loads(routed.body) == chat(LONG)
        answer = orjson.dumps({"choices": [], "usage": usage(40, 16)})
        await f.respond(200, [answer], served=routed.endpoints[0])
        assert p.metric("kvrouter_cached_tokens_total") == 16
        assert p.metric("kvrouter_epp_decisions_total", mode="buffered") == 1


async def test_picker_without_protocol_config_works_buffered(tmp_path: Path) -> None:
    config = FilterConfig(request_body_mode=BUFFERED, send_protocol_config=False)
    async with picking(tmp_path) as p:
        routed = await p.route(chat(LONG), config)
        assert routed.endpoints and routed.immediate is None


@pytest.mark.parametrize("mode", [Mode.STREAMED, Mode.BUFFERED_PARTIAL])
async def test_picker_refuses_a_body_mode_it_cannot_pick_in(tmp_path: Path, mode: int) -> None:
    async with picking(tmp_path) as p:
        f = p.filter(FilterConfig(request_body_mode=mode))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await f.request("POST", "/v1/chat/completions", {}, json.dumps(chat()).encode())
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "BUFFERED or FULL_DUPLEX_STREAMED" in (e.value.details() or "")


async def test_picker_honours_the_subset_hint(tmp_path: Path) -> None:
    engines = (FakeEngine(A), FakeEngine(B), FakeEngine(C))
    async with picking(tmp_path, *engines) as p:
        for text in ("one", "two", "three", "four"):
            routed = await p.route(chat(text * 10), subset=[EP_C])
            assert routed.endpoints == [EP_C]
        routed = await p.route(chat(LONG), subset_value=f"{EP_B}, {EP_C}")
        assert sorted(routed.endpoints) == [EP_B, EP_C]


@pytest.mark.parametrize(
    "subset", [["10.9.9.9:8000"], [], ["not an endpoint"]], ids=["unknown", "empty", "garbage"]
)
async def test_picker_subset_naming_nothing_known_is_an_immediate_503(
    tmp_path: Path, subset: list[str]
) -> None:
    async with picking(tmp_path) as p:
        routed = await p.route(chat(LONG), subset=subset)
        assert routed.immediate is not None and routed.immediate.status.code == 503
        assert error_of(routed)["code"] == "no_backend_available"
        assert p.metric("kvrouter_epp_immediate_responses_total", code="503") == 1


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (json.dumps({"model": "m"}).encode(), 400, "'messages' is required"),
        (json.dumps(chat(model="nope")).encode(), 404, "does not exist"),
    ],
    ids=["not-json", "not-object", "no-messages", "unknown-model"],
)
async def test_picker_bad_body_is_an_immediate_error_in_openai_shape(
    tmp_path: Path, body: bytes, status: int, words: str
) -> None:
    for config in (FilterConfig(), FilterConfig(request_body_mode=BUFFERED)):
        async with picking(tmp_path) as p:
            routed = await p.route(body, config)
            assert routed.immediate is not None and routed.immediate.status.code == status
            err = error_of(routed)
            assert words in err["message"] and set(err) == {"message", "type", "param", "code"}


async def test_picker_body_over_the_limit_is_a_413(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:  # the rig's limit is 4096 bytes
        routed = await p.route(chat("x" * 8000), FilterConfig(chunk_bytes=1024))
        assert routed.immediate is not None and routed.immediate.status.code == 413


async def test_picker_unknown_path_is_a_404(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(), path="/v1/images/generations")
        await f.close()
        assert routed.immediate is not None and routed.immediate.status.code == 404


async def test_picker_request_without_body_takes_turns(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        seen = set()
        for _ in range(4):
            f = p.filter()
            routed = await f.request("GET", "/v1/models", {}, b"")
            seen.add(routed.endpoints[0])
            await f.respond(200, [b'{"data": []}'], served=routed.endpoints[0])
        assert seen == {EP_A, EP_B}
        assert p.metric("kvrouter_epp_decisions_total", mode="headers_only") == 4
        # A client's path is never a label: only the generation routes are counted.
        assert p.metric("kvrouter_requests_total", route="/v1/models", code="200") == 0


async def test_picker_model_rewrite_routes_and_rewrites_the_body(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        headers = {msg.MODEL_REWRITE: "m", "content-type": "application/json"}
        f, routed = await p.ask(chat(LONG, model="alias"), headers=headers)
        assert routed.immediate is None
        assert json.loads(routed.body)["model"] == "m"
        assert routed.headers["content-length"] == str(len(routed.body))
        assert msg.MODEL_REWRITE not in routed.headers
        await f.respond(200, [b"{}"], served=routed.endpoints[0])
        # Without the rewrite, the alias is no model any engine serves.
        routed = await p.route(chat(LONG, model="alias"))
        assert routed.immediate is not None and routed.immediate.status.code == 404


async def test_picker_fallback_served_moves_the_lease_and_the_prefix(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG))
        pick, fallback = routed.endpoints
        await f.respond(200, [b"{}"], served=fallback)
        assert p.metric("kvrouter_epp_picks_total", served="fallback") == 1
        gw = p.rig.gw
        engine = p.server.endpoints.engine_of(fallback)
        assert engine is not None and gw.core.index.blocks(engine) > 0
        assert gw.core.index.blocks(p.server.endpoints.engine_of(pick) or "") == 0


async def test_picker_served_as_a_response_header_counts_too(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG))
        fallback = routed.endpoints[1]
        await f.respond(200, [b"{}"], served=None, headers={msg.SERVED: fallback})
        assert p.metric("kvrouter_epp_picks_total", served="fallback") == 1


async def test_picker_streamed_response_reads_usage_from_the_last_event(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG, stream=True))
        events = [
            b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n',
            b'data: {"choices": [], "usage": ' + orjson.dumps(usage(40, 24)) + b"}\n\n",
            b"data: [DONE]\n\n",
        ]
        sse = {"content-type": "text/event-stream"}
        out = await f.respond(200, events, served=routed.endpoints[0], headers=sse)
        assert out == b"".join(events)
        assert p.metric("kvrouter_cached_tokens_total") == 24


async def test_picker_response_trailers_end_the_response(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        config = FilterConfig(response_trailer_mode=Mode.SEND)
        f, routed = await p.ask(chat(LONG), config)
        await f.respond(200, [b"{}"], served=routed.endpoints[0])


async def test_picker_engine_error_records_nothing(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG))
        await f.respond(503, [b'{"error": {}}'], served=routed.endpoints[0])
        assert p.rig.gw.core.index.blocks(A) == p.rig.gw.core.index.blocks(B) == 0


@pytest.mark.parametrize("where", ["after-headers", "mid-body", "after-pick", "mid-response"])
async def test_picker_reset_or_early_end_leaks_nothing(tmp_path: Path, where: str) -> None:
    async with picking(tmp_path) as p:
        f = p.filter()
        raw = json.dumps(chat(LONG)).encode()
        if where in ("after-headers", "mid-body"):
            await f.request("POST", "/v1/chat/completions", {}, raw, end_early=True)
            if where == "after-headers":
                f.reset()
            else:
                await f.close()
        else:
            routed = await f.request("POST", "/v1/chat/completions", {}, raw)
            if where == "mid-response":
                await f.respond_headers(200, {}, routed.endpoints[0], has_body=True)
                await f.respond_chunk(b'{"choices": [', False)
            f.reset()
            phase = "response" if where == "mid-response" else "request"
            await eventually(
                lambda: p.metric("kvrouter_epp_stream_resets_total", phase=phase) == 1,
                timeout=5.0,
                interval=0.01,
            )
        await eventually(lambda: p.rig.gw.core.outstanding == 0, timeout=5.0, interval=0.01)


async def test_picker_survives_garbage_grpc_frames(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        raw = p.channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\x05abc", bytes(range(256))):
            call = raw()
            await call.write(garbage)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in call:
                    pass
            assert e.value.code() != grpc.StatusCode.OK
        routed = await p.route(chat(LONG))  # and it still picks
        assert routed.endpoints


async def test_picker_sheds_with_an_immediate_429(tmp_path: Path) -> None:
    flow = FlowControl(max_inflight_per_engine=1, max_queue=0)
    async with picking(tmp_path, FakeEngine(A), flow_control=flow) as p:
        f, held = await p.ask(chat("first" * 20))
        assert held.immediate is None
        routed = await p.route(chat("second" * 20))
        assert routed.immediate is not None and routed.immediate.status.code == 429
        assert error_of(routed)["code"] == "rate_limit_exceeded"
        assert p.metric("kvrouter_epp_immediate_responses_total", code="429") == 1
        await f.respond(200, [b"{}"], served=held.endpoints[0])


async def test_picker_priority_from_the_objective_header(tmp_path: Path) -> None:
    flow = FlowControl(max_inflight_per_engine=1, max_queue=4)
    engines = (FakeEngine(A),)
    async with picking(tmp_path, *engines, flow_control=flow) as p:
        f, routed = await p.ask(chat("holder" * 20))
        order: list[str] = []

        async def waiting(name: str, objective: str) -> None:
            headers = {msg.OBJECTIVE: objective, msg.FAIRNESS: name}
            g, r = await p.ask(chat(name * 20), headers=headers)
            order.append(name)
            await g.respond(200, [b"{}"], served=r.endpoints[0])

        low = asyncio.create_task(waiting("sheddable", "-5"))
        await eventually(lambda: p.rig.gw.admission.waiting == 1, timeout=5.0, interval=0.01)
        high = asyncio.create_task(waiting("critical", "10"))
        await eventually(lambda: p.rig.gw.admission.waiting == 2, timeout=5.0, interval=0.01)
        await f.respond(200, [b"{}"], served=routed.endpoints[0])
        await asyncio.wait_for(asyncio.gather(low, high), 10)
        assert order == ["critical", "sheddable"]


async def test_picker_health_follows_readiness(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        stub = health_pb2_grpc.HealthStub(p.channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("liveness", "readiness", "", "envoy.service.ext_proc.v3.ExternalProcessor"):
            got = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert got.status == serving, service
        p.rig.gw.drain.started = True  # as a stop begins: /ready turns 503, so does readiness

        async def not_ready() -> bool:
            got = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
            return bool(got.status == health_pb2.HealthCheckResponse.NOT_SERVING)

        await eventually(not_ready, timeout=5.0, interval=0.05)
        live = await stub.Check(health_pb2.HealthCheckRequest(service="liveness"))
        assert live.status == serving
        p.rig.gw.drain.started = False


async def test_endpoints_follow_the_pool_and_resolve_names(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        eps = p.server.endpoints
        assert eps.endpoint_of(A) == EP_A and eps.engine_of(EP_B) == B
        assert eps.engines_at([EP_A, "10.0.0.2:8000", "junk"]) == {A, B}
        assert await fake_resolve("engine-c", 1) == "10.0.0.3"
        assert eps.engine_of(EP_C) is None  # not in the pool


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED], ids=["full-duplex", "buffered"])
async def test_picker_asks_envoy_for_no_mode_override(tmp_path: Path, mode: int) -> None:
    # Envoy honours mode_override only where allowed (allow_mode_override); the picker needs
    # the modes it was given, so it never asks, and the request is routed as configured.
    config = FilterConfig(request_body_mode=mode, response_body_mode=mode, allow_mode_override=True)
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG), config)
        assert routed.mode_overrides == [] and routed.endpoints
        await f.respond(200, [b"{}"], served=routed.endpoints[0])


async def test_picker_without_the_response_body_ends_at_the_response_headers(
    tmp_path: Path,
) -> None:
    # response_body_mode NONE: Envoy sends the response's headers and then closes the stream.
    config = FilterConfig(response_body_mode=Mode.NONE)
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG), config)
        await f.respond(200, [b"{}"], served=routed.endpoints[0])
        engine = p.server.endpoints.engine_of(routed.endpoints[0])
        assert engine is not None and p.rig.gw.core.index.blocks(engine) > 0
        assert p.metric("kvrouter_epp_stream_resets_total", phase="response") == 0
        assert p.rig.gw.core.outstanding == 0
