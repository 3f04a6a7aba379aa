"""The endpoint picker in a fleet whose prefill and decode engines run apart: a split request
goes to its decode engine with the prefill engine named in llm-d's header, both engines are
leased and both recorded; a whole request is picked as any; a client cannot name a prefill
engine. The rig's exit checks that every lease was given back."""

from __future__ import annotations

from pathlib import Path

import orjson

from router.core.disaggregation import DisaggSettings
from router.gateway.config.engines import EngineSources
from router.gateway.extproc import messages as msg
from tests.fakes import FakeEngine
from tests.gateway.extproc.picking import EP_A, EP_B, EP_C, picking, usage
from tests.gateway.rig import A, B, C, chat
from tests.support import eventually

LONG = "a shared system prompt that spans more than one block of sixteen characters " * 8
ROLES = EngineSources(static=(A, B, C), static_roles={A: "prefill", B: "decode", C: "decode"})
ENGINES = (FakeEngine(A), FakeEngine(B), FakeEngine(C))


async def test_a_split_request_goes_to_its_decode_engine_naming_the_prefill(
    tmp_path: Path,
) -> None:
    always = DisaggSettings(decider="always")
    async with picking(tmp_path, *ENGINES, engines=ROLES, disaggregation=always) as p:
        f, routed = await p.ask(chat(LONG), headers={"x-prefiller-host-port": "10.9.9.9:1"})
        assert routed.immediate is None
        # The plan is the decode engines; the prefill engine rides in its own header.
        assert sorted(routed.endpoints) == [EP_B, EP_C]
        assert routed.headers[msg.PREFILLER] == EP_A
        gw = p.rig.gw
        assert gw.core.outstanding == 2  # the decode engine's lease and the prefill engine's
        assert gw.core.loads.tokens([A])[0] > 0  # the prefill is charged where it runs
        decode = p.server.endpoints.engine_of(routed.endpoints[0])
        assert decode is not None and gw.core.loads.tokens([decode]) == [0]
        answer = {"choices": [], "usage": usage(120, 0)}
        await f.respond(200, [orjson.dumps(answer)], served=routed.endpoints[0])
        # The decode engine's answer means both hold the prompt now.
        assert gw.core.index.blocks(A) > 0 and gw.core.index.blocks(decode) > 0
        assert p.metric("kvrouter_disagg_decisions_total", path="split", why="decider-always") == 1
        assert gw.core.outstanding == 0


async def test_a_split_that_envoy_moves_to_another_decode_engine_keeps_its_prefill(
    tmp_path: Path,
) -> None:
    always = DisaggSettings(decider="always")
    async with picking(tmp_path, *ENGINES, engines=ROLES, disaggregation=always) as p:
        f, routed = await p.ask(chat(LONG))
        pick, fallback = routed.endpoints
        await f.respond(200, [b"{}"], served=fallback)
        gw = p.rig.gw
        moved = p.server.endpoints.engine_of(fallback)
        assert moved is not None and gw.core.index.blocks(moved) > 0
        assert gw.core.index.blocks(p.server.endpoints.engine_of(pick) or "") == 0
        assert gw.core.index.blocks(A) > 0
        assert p.metric("kvrouter_epp_picks_total", served="fallback") == 1


async def test_a_whole_request_is_picked_as_any_and_names_no_prefill(tmp_path: Path) -> None:
    # Idle engines and the cost decider: a short prompt stays whole where it decodes.
    async with picking(tmp_path, *ENGINES, engines=ROLES) as p:
        f, routed = await p.ask(chat("a short question"), headers={msg.PREFILLER: "10.9.9.9:1"})
        assert routed.immediate is None
        assert msg.PREFILLER not in routed.headers  # the client's own value is dropped
        assert p.rig.gw.core.outstanding == 1
        assert p.metric("kvrouter_disagg_decisions_total", path="whole", why="few-new-tokens") == 1
        await f.respond(200, [b"{}"], served=routed.endpoints[0])


async def test_an_aggregated_fleet_drops_a_client_s_prefill_header(tmp_path: Path) -> None:
    async with picking(tmp_path) as p:
        f, routed = await p.ask(chat(LONG), headers={msg.PREFILLER: "10.9.9.9:1"})
        assert routed.immediate is None and msg.PREFILLER not in routed.headers
        await f.respond(200, [b"{}"], served=routed.endpoints[0])


async def test_a_split_reset_before_its_answer_gives_both_leases_back(tmp_path: Path) -> None:
    always = DisaggSettings(decider="always")
    async with picking(tmp_path, *ENGINES, engines=ROLES, disaggregation=always) as p:
        f, routed = await p.ask(chat(LONG))
        assert routed.immediate is None and p.rig.gw.core.outstanding == 2
        f.reset()
        gw = p.rig.gw
        await eventually(lambda: gw.core.outstanding == 0, timeout=5.0, interval=0.01)
        assert gw.core.loads.tokens([A]) == [0]
