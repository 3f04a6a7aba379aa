"""The engine pool: health transitions, candidates per model, model lists and DNS."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pytest

from router.core.decision import RoutingCore
from router.gateway.config.engines import DnsEngines, EngineSources
from router.gateway.config.settings import HealthSettings
from router.gateway.fleet.pool import (
    EnginePool,
    Health,
    HealthRules,
    State,
    parse_models,
    resolve_dns,
    url_for,
)
from router.gateway.openai.errors import NoEngine, NotFound
from router.gossip.clock import ManualClock
from router.presets import preset_path
from router.yaml_files import load_policy
from tests.fakes import FakeEngine, FakeUpstream

CFG = HealthSettings(
    eject_after_failures=3, readmit_backoff_seconds=5, readmit_backoff_max_seconds=20
)
A, B, C = "http://a:1", "http://b:1", "http://c:1"


def healthy(now: float = 0.0) -> Health:
    return Health(State.HEALTHY, healthy_since=now)


# -- health rules ------------------------------------------------------------------------


def test_health_pending_first_success_healthy() -> None:
    h = Health()
    assert HealthRules(CFG).success(h, 0.0, probe=True)
    assert h.state is State.HEALTHY


def test_health_pending_failures_stay_pending_not_ejected() -> None:
    h = Health()
    rules = HealthRules(CFG)
    for _ in range(5):
        assert not rules.failure(h, 0.0, probe=True)
    assert h.state is State.PENDING


def test_health_consecutive_failures_eject_at_threshold() -> None:
    h, rules = healthy(), HealthRules(CFG)
    assert not rules.failure(h, 1.0, probe=False)
    assert not rules.failure(h, 1.0, probe=True)
    assert rules.failure(h, 1.0, probe=False)
    assert h.state is State.EJECTED and h.readmit_at == 6.0


def test_health_success_resets_consecutive_count() -> None:
    h, rules = healthy(), HealthRules(CFG)
    rules.failure(h, 1.0, probe=False)
    rules.failure(h, 1.0, probe=False)
    rules.success(h, 1.0, probe=False)
    assert not rules.failure(h, 1.0, probe=False)
    assert h.state is State.HEALTHY


def test_health_ejected_readmitted_only_by_probe_after_backoff() -> None:
    h, rules = healthy(), HealthRules(CFG)
    for _ in range(3):
        rules.failure(h, 0.0, probe=False)
    assert not rules.success(h, 4.9, probe=True)  # too early
    assert not rules.success(h, 6.0, probe=False)  # a request is no proof
    assert rules.success(h, 5.0, probe=True)
    assert h.state is State.HEALTHY and h.failures == 0


def test_health_failed_trials_double_backoff_up_to_max() -> None:
    h, rules = healthy(), HealthRules(CFG)
    for _ in range(3):
        rules.failure(h, 0.0, probe=False)
    waits = []
    now = 0.0
    for _ in range(4):
        now = h.readmit_at
        rules.failure(h, now, probe=True)
        waits.append(h.readmit_at - now)
    assert waits == [10.0, 20.0, 20.0, 20.0]


def test_health_reejection_backs_off_longer_until_stable() -> None:
    h, rules = healthy(), HealthRules(CFG)
    for _ in range(3):
        rules.failure(h, 0.0, probe=False)
    rules.success(h, 5.0, probe=True)
    for _ in range(3):
        rules.failure(h, 6.0, probe=False)
    assert h.readmit_at - 6.0 == 10.0  # flapping: the second ejection waits longer
    rules.success(h, 16.0, probe=True)
    rules.success(h, 16.0 + 20.0, probe=True)  # healthy for the maximum backoff: reset
    for _ in range(3):
        rules.failure(h, 40.0, probe=False)
    assert h.readmit_at - 40.0 == 5.0


# -- the pool ----------------------------------------------------------------------------


class Engines:
    """Records every ``RoutingCore.set_engines`` call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, int]] = []

    def __call__(self, weights: Mapping[str, int]) -> None:
        self.calls.append(dict(weights))


def pool_of(
    *engines: FakeEngine, dns: DnsEngines | None = None, static: tuple[str, ...] | None = None
) -> tuple[EnginePool, FakeUpstream, Engines, ManualClock]:
    up = FakeUpstream(*engines)
    calls = Engines()
    clock = ManualClock()
    urls = tuple(e.url for e in engines) if static is None else static
    cfg = EngineSources(static=urls, dns=() if dns is None else (dns,))
    return EnginePool(cfg, CFG, up, calls, clock=clock), up, calls, clock


async def test_pool_static_engines_told_to_router_at_start() -> None:
    pool, _, calls, _ = pool_of(FakeEngine(A), FakeEngine(B))
    assert calls.calls == [{A: 1, B: 1}]
    assert not pool.ready()


async def test_pool_probe_makes_healthy_with_models_candidates_per_model() -> None:
    pool, _, _, _ = pool_of(FakeEngine(A, ["m", "n"]), FakeEngine(B, ["m"]))
    await pool.probe_all()
    assert pool.ready()
    assert pool.candidates("m") == (A, B)
    assert pool.candidates("n") == (A,)


async def test_pool_unknown_model_404_known_but_unhealthy_503() -> None:
    a, b = FakeEngine(A, ["m"]), FakeEngine(B, ["n"])
    pool, _, _, _ = pool_of(a, b)
    await pool.probe_all()
    with pytest.raises(NotFound) as e:
        pool.candidates("zzz")
    assert e.value.code == "model_not_found" and e.value.param == "model"
    b.down = True
    for _ in range(3):
        pool.report_failure(B, "boom")
    with pytest.raises(NoEngine, match="no healthy engine serves model 'n'"):
        pool.candidates("n")


async def test_pool_nothing_healthy_503_not_404() -> None:
    pool, _, _, _ = pool_of(FakeEngine(A, ["m"]))
    with pytest.raises(NoEngine):
        pool.candidates("zzz")


async def test_pool_ejected_not_candidate_index_kept_readmitted_after_backoff() -> None:
    a, b = FakeEngine(A), FakeEngine(B)
    pool, up, _, clock = pool_of(a, b)
    core = RoutingCore(load_policy(preset_path("kv-aware")))
    core.set_engines({A: 1, B: 1})
    await pool.probe_all()
    core.index.confirm(A, [1, 2, 3], clock())
    for _ in range(3):
        pool.report_failure(A, "connect refused")
    assert pool.candidates("m") == (B,)
    assert core.index.blocks(A) == 3  # kept while ejected
    await pool.probe_all()  # healthy again, but the backoff has not passed
    assert pool.candidates("m") == (B,)
    await clock.advance(CFG.readmit_backoff_seconds)
    await pool.probe_all()
    assert pool.candidates("m") == (A, B)
    assert len(up.unfinished()) == 0


async def test_pool_probe_non_200_counts_as_failure() -> None:
    a = FakeEngine(A)
    pool, _, _, _ = pool_of(a)
    await pool.probe_all()
    a.health_status = 503
    for _ in range(3):
        await pool.probe_all()
    assert not pool.ready()
    assert pool.engines[A].health.state is State.EJECTED


async def test_pool_models_refresh_changes_candidates_and_union() -> None:
    a, b = FakeEngine(A, ["m"]), FakeEngine(B, ["n"])
    pool, _, _, _ = pool_of(a, b)
    await pool.probe_all()
    assert b'"id":"m"' in pool.models_body() and b'"id":"n"' in pool.models_body()
    a.models = ["m", "x"]
    await pool.refresh_all_models()
    assert pool.candidates("x") == (A,)
    assert b'"id":"x"' in pool.models_body()


async def test_pool_models_union_only_healthy() -> None:
    a, b = FakeEngine(A, ["m"]), FakeEngine(B, ["n"])
    pool, _, _, _ = pool_of(a, b)
    await pool.probe_all()
    for _ in range(3):
        pool.report_failure(B, "boom")
    assert b'"id":"n"' not in pool.models_body()


async def test_pool_models_lists_aliases_of_served_models_as_their_cards() -> None:
    a, b = FakeEngine(A, ["m"]), FakeEngine(B, ["n"])
    pool, _, _, _ = pool_of(a, b)
    await pool.probe_all()
    pool.set_aliases({"fast": "m", "ghost": "nobody-serves-it"})
    cards = {c["id"]: c for c in orjson.loads(pool.models_body())["data"]}
    assert sorted(cards) == ["fast", "m", "n"]
    assert cards["fast"] == {**cards["m"], "id": "fast"}
    pool.set_aliases({})
    assert b'"id":"fast"' not in pool.models_body()


async def test_pool_models_failure_keeps_last_list() -> None:
    a = FakeEngine(A, ["m"])
    pool, _, _, _ = pool_of(a)
    await pool.probe_all()
    a.down = True
    await pool.refresh_all_models()
    assert "m" in (pool.engines[A].models or {})


async def test_pool_dns_adds_and_removes_engines_keeps_static_and_last_answer() -> None:
    answers: list[list[str] | OSError] = [["10.0.0.1", "10.0.0.2"], ["10.0.0.2"], OSError("down")]

    async def resolver(name: str, port: int) -> list[str]:
        assert (name, port) == ("engines", 9)
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    up = FakeUpstream()
    calls = Engines()
    cfg = EngineSources(static=(A,), dns=(DnsEngines("engines", 9),))
    pool = EnginePool(cfg, CFG, up, calls, resolver=resolver)
    await pool.resolve_once()
    assert set(pool.engines) == {A, "http://10.0.0.1:9", "http://10.0.0.2:9"}
    assert pool.engines["http://10.0.0.1:9"].source == "dns:engines"
    await pool.resolve_once()
    assert set(pool.engines) == {A, "http://10.0.0.2:9"}
    await pool.resolve_once()  # resolution failed: keep what we had
    assert set(pool.engines) == {A, "http://10.0.0.2:9"}
    assert calls.calls[-1] == {A: 1, "http://10.0.0.2:9": 1}
    assert len(calls.calls) == 3


async def test_pool_dns_name_per_pool_gives_each_engine_its_role_and_bootstrap_port() -> None:
    found = {"prefill.svc": ["10.0.1.1"], "decode.svc": ["10.0.2.1", "10.0.2.2"]}

    async def resolver(name: str, port: int) -> list[str]:
        return found[name]

    prefill = DnsEngines("prefill.svc", 9, role="prefill", kind="sglang", bootstrap_port=8998)
    decode = DnsEngines("decode.svc", 9, role="decode", kind="sglang")
    cfg = EngineSources(static=(A,), dns=(prefill, decode))
    pool = EnginePool(cfg, CFG, FakeUpstream(), Engines(), resolver=resolver)
    await pool.resolve_once()
    assert set(pool.engines) == {A, "http://10.0.1.1:9", "http://10.0.2.1:9", "http://10.0.2.2:9"}
    assert pool.roles() == {
        "http://10.0.1.1:9": "prefill",
        "http://10.0.2.1:9": "decode",
        "http://10.0.2.2:9": "decode",
    }
    assert pool.role_of(A) == "both" and pool.kind_of(A) == "vllm"
    assert pool.kind_of("http://10.0.2.1:9") == "sglang"
    assert pool.bootstrap_port_of("http://10.0.1.1:9") == 8998
    assert pool.bootstrap_port_of("http://10.0.2.1:9") is None
    # One name's answer changes: the other name's engines stay, and the roles follow.
    found["decode.svc"] = ["10.0.2.2"]
    await pool.resolve_once()
    assert pool.roles() == {"http://10.0.1.1:9": "prefill", "http://10.0.2.2:9": "decode"}


def test_url_for_brackets_ipv6() -> None:
    assert url_for("http", "::1", 8000) == "http://[::1]:8000"
    assert url_for("https", "10.1.2.3", 443) == "https://10.1.2.3:443"


@pytest.mark.parametrize(
    ("body", "says"),
    [(b"nope", "not JSON"), (b"{}", "no 'data' array"), (b'{"data": 3}', "no 'data' array")],
)
def test_parse_models_bad_body_says_why(body: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_models(body)


def test_parse_models_skips_cards_without_id() -> None:
    got = parse_models(b'{"data": [{"id": "a"}, {"x": 1}, 3, {"id": ""}]}')
    assert list(got) == ["a"]


async def test_resolve_dns_localhost_has_loopback() -> None:
    assert "127.0.0.1" in await resolve_dns("localhost", 8000)


def test_parse_models_keeps_only_the_public_fields_of_each_card() -> None:
    vllm_card = {
        "id": "llama",
        "object": "model",
        "created": 1700000000,
        "owned_by": "vllm",
        "root": "/srv/models/llama-3-70b-instruct",
        "parent": None,
        "max_model_len": 8192,
        "permission": [{"id": "modelperm-1", "allow_sampling": True}],
        "created_by": True,  # a field of the right name and the wrong type goes too
    }
    body = orjson.dumps({"object": "list", "data": [vllm_card, {**vllm_card, "id": "m2"}]})
    cards = parse_models(body)
    assert cards["llama"] == {
        "id": "llama",
        "object": "model",
        "created": 1700000000,
        "owned_by": "vllm",
        "max_model_len": 8192,
    }
    assert "/srv" not in orjson.dumps(cards).decode()
