"""A replica's gossip settings and its glue to the routing core, in one process.

``gossip_config`` is checked table by table (flags, file, environment, defaults). Replicas are
real ``RoutingCore`` + ``Replica`` pairs on the in-memory network and a virtual clock: what one
routes, the others route the same way; a dead peer's load leaves the books, its blocks stay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.core.decision import RoutingCore
from router.core.fields import ConfigError
from router.core.load import Load
from router.core.policy import load_policy_text
from router.gateway.config.engines import engine_url
from router.gateway.config.gossip import GossipSettings, GossipTls
from router.gateway.config.overrides import with_overrides
from router.gateway.config.settings import Config, Listen, load_config_text
from router.gateway.fleet.pool import url_for
from router.gateway.metrics import FleetView, Metrics
from router.gateway.replicas.node_config import gossip_config
from router.gateway.replicas.replica import Replica
from router.gossip import LAN, LOCAL, ManualClock, State
from router.gossip.transport import InMemoryNetwork
from router.presets import preset_path
from router.yaml_files import load_policy

SECRET = "replica-test-secret-0123456789"
ENV = {"KVROUTER_GOSSIP_SECRET": SECRET}
POD = {**ENV, "POD_IP": "10.9.8.7", "POD_NAME": "kv-0"}  # the chart's downward API
ENGINES = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
PROMPT = "the quick brown fox jumps over the lazy dog " * 60


def cfg(host: str = "127.0.0.1", **gossip: Any) -> Config:
    return Config(
        listen=Listen(host, 8000), gossip=GossipSettings(enabled=True, port=7946, **gossip)
    )


def no_name(_name: str) -> list[str]:
    return []


def config_of(c: Config, env: dict[str, str] | None = None, addrs: list[str] | None = None) -> Any:
    return gossip_config(
        c,
        ENV if env is None else env,
        hostname=lambda: "router-host",
        host_addresses=lambda _n: addrs or [],
    )


# -- settings ----------------------------------------------------------------------------------


def test_gossip_config_off_is_none() -> None:
    assert gossip_config(Config(), ENV) is None


@pytest.mark.parametrize(
    ("config", "env", "addrs", "node_id", "advertise"),
    [
        (cfg(), ENV, None, "router-host:7946", "127.0.0.1:7946"),
        (cfg("localhost"), ENV, None, "router-host:7946", "127.0.0.1:7946"),
        (cfg("10.1.2.3"), ENV, None, "router-host:7946", "10.1.2.3:7946"),
        (cfg("0.0.0.0"), POD, None, "kv-0", "10.9.8.7:7946"),
        (cfg("::"), {**ENV, "POD_IP": "fd00::5"}, None, "router-host:7946", "[fd00::5]:7946"),
        (cfg("0.0.0.0"), ENV, ["127.0.1.1", "10.0.0.9"], "router-host:7946", "10.0.0.9:7946"),
        (cfg("0.0.0.0", advertise="h.x:7000", node_id="n1"), POD, None, "n1", "h.x:7000"),
    ],
    ids=[
        "loopback",
        "localhost-advertises-127",
        "specific-ip",
        "wildcard-pod-env",
        "wildcard-v6-pod-ip",
        "wildcard-hostname-skips-loopback",
        "explicit-wins",
    ],
)  # fmt: skip
def test_gossip_config_identity_defaults(
    config: Config, env: dict[str, str], addrs: list[str] | None, node_id: str, advertise: str
) -> None:
    g = config_of(config, env, addrs)
    assert (g.node_id, g.advertise) == (node_id, advertise)
    assert g.bind.endswith(":7946") and g.secret == SECRET.encode() and g.tuning == LAN


@pytest.mark.parametrize(
    ("config", "env", "message"),
    [
        (cfg(), {}, "set KVROUTER_GOSSIP_SECRET to a shared secret"),
        (cfg(), {"KVROUTER_GOSSIP_SECRET": "short"}, "at least 16 bytes, got 5"),
        (cfg(secret_env="MY_SECRET"), ENV, "set MY_SECRET"),
        (cfg("0.0.0.0"), ENV, "give --gossip-advertise HOST:PORT"),
        (cfg(tls=GossipTls(cert_file="/x.pem")), ENV, "gossip.tls.key_file: mutual TLS needs"),
        (
            cfg(tls=GossipTls("/nonexistent/c", "/nonexistent/k", "/nonexistent/ca")),
            ENV,
            "gossip.tls.cert_file: cannot read /nonexistent/c",
        ),
    ],
    ids=["no-secret", "short-secret", "secret-env-named", "wildcard-unknown-ip", "tls-partial",
         "tls-unreadable"],
)  # fmt: skip
def test_gossip_config_refused_with_reason(
    config: Config, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        config_of(config, env)
    assert message in str(e.value)


def test_gossip_config_tls_without_secret_seeds_dns_preset(tmp_path: Path) -> None:
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("pem")
    tls = GossipTls(*(str(tmp_path / n) for n in ("c.pem", "k.pem", "ca.pem")))
    c = cfg(tls=tls, peers=("10.0.0.1:7946",), dns="routers.ns.svc:7000", preset="local")
    g = config_of(c, env={})
    assert g.secret is None and g.tls is not None and g.tls.ca == tmp_path / "ca.pem"
    assert g.seeds == ("10.0.0.1:7946",) and g.dns_target == ("routers.ns.svc", 7000)
    assert g.tuning == LOCAL


def test_overrides_gossip_port_turns_gossip_on_flags_replace_file() -> None:
    file = load_config_text(
        "gossip: {port: 7000, peers: ['a:1'], dns: 'routers:7000', preset: lan}", "c.yaml"
    )
    assert not file.gossip.enabled
    c = with_overrides(
        file, gossip_port=7100, gossip_peers=["b:2", "[::1]:3"], gossip_preset="local"
    )
    g = c.gossip
    assert (g.enabled, g.port, g.peers, g.dns, g.preset) == (
        True,
        7100,
        ("b:2", "[::1]:3"),
        "routers:7000",
        "local",
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"gossip_peers": ["a:1"]}, "--gossip-peer needs gossip on: give --gossip-port P"),
        ({"gossip_port": 7000, "gossip_peers": ["nope"]}, "--gossip-peer: must be HOST:PORT"),
        ({"gossip_port": 7000, "gossip_dns": "n:0"}, "--gossip-dns: must be HOST:PORT"),
        ({"gossip_port": 7000, "gossip_advertise": "h"}, "--gossip-advertise: must be HOST:PORT"),
        ({"gossip_port": 70000}, "--gossip-port: must be from 1 to 65535"),
    ],
    ids=["peer-without-gossip", "peer-bad", "dns-bad-port", "advertise-no-port", "port-range"],
)
def test_overrides_gossip_flag_errors_name_the_flag(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        with_overrides(Config(), **flags)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gossip: {peers: ['x']}", "c.yaml: gossip.peers[0]: must be HOST:PORT"),
        ("gossip: {preset: wan}", "c.yaml: gossip.preset: must be one of lan, local"),
        ("gossip: {advertise: 'h:x'}", "c.yaml: gossip.advertise: must be HOST:PORT"),
    ],
    ids=["peer", "preset", "advertise"],
)
def test_config_gossip_fields_checked(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "c.yaml")
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("static", "dns"),
    [
        ("http://10.0.0.5/", ("http", "10.0.0.5", 80)),
        ("HTTP://10.0.0.5:8000", ("http", "10.0.0.5", 8000)),
        ("https://[fd00:0::7]:443/", ("https", "fd00::7", 443)),
    ],
    ids=["default-port", "case", "v6"],
)
def test_engine_name_same_from_static_url_and_dns(static: str, dns: tuple[str, str, int]) -> None:
    # Deltas name engines by URL: a replica configured by URL and one discovering the engine by
    # DNS must agree on its name.
    assert engine_url(static) == url_for(*dns)


# -- replicas in one process -------------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    core: RoutingCore
    replica: Replica


class Replicas:
    """Routing cores with their replicas on one in-memory network and one virtual clock."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.network = InMemoryNetwork(self.clock, max_message_bytes=LOCAL.max_message_bytes)
        self.started: list[Pair] = []

    async def start(self, name: str, seeds: tuple[str, ...] = (), policy: Any = None) -> Pair:
        from router.gateway.replicas.delegate import run_origin
        from router.gossip import GossipConfig

        address = f"10.1.0.{len(self.started) + 1}:7946"
        config = GossipConfig(
            node_id=name, bind=address, seeds=seeds, secret=SECRET.encode(), tuning=LOCAL
        )
        core = RoutingCore(policy or load_policy(preset_path("kv-aware")), run_origin(name))
        core.set_engines(dict.fromkeys(ENGINES, 1))
        replica = Replica(
            config,
            core,
            now=self.clock.now,
            transport=self.network.transport(address),
            clock=self.clock,
        )
        await replica.node.start()
        pair = Pair(core, replica)
        self.started.append(pair)
        return pair

    async def settle(self, done: Any, limit: float = 5.0) -> bool:
        return await self.clock.run_until(done, 0.01, limit)

    async def close(self) -> None:
        for p in self.started:
            await p.replica.node.stop(leave=False)


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    r = Replicas()
    try:
        yield r
    finally:
        await r.close()


def route(p: Pair, prompt: str = PROMPT) -> Any:
    """What an exchange does: decide, acquire, record on the answer, publish the delta."""
    d = p.core.decide({"model": "m", "prompt": prompt}, ENGINES, now=0.0)
    delta = p.core.record(p.core.acquire(d, str(d.engine), 0.0), now=0.0)
    assert delta is not None
    p.replica.queue(delta)
    return d


def overlap(p: Pair, prompt: str = PROMPT) -> dict[str, int]:
    _, keys = p.core.keys_of({"model": "m", "prompt": prompt})
    return dict(zip(ENGINES, p.core.index.overlaps(keys, ENGINES), strict=True))


async def test_replica_routed_on_a_routes_same_on_b_load_summed_dead_load_dropped(
    replicas: Replicas,
) -> None:
    a = await replicas.start("a")
    b = await replicas.start("b", seeds=("10.1.0.1:7946",))
    assert await replicas.settle(lambda: b.replica.peers()["alive"] == 1)
    # Make the decision matter: the ring home on idle engines would agree without gossip.
    prompt = "tenant x " + PROMPT
    first = route(a, prompt)
    assert first.engine is not None
    assert await replicas.settle(lambda: overlap(b, prompt)[first.engine] > 0)
    again = b.core.decide({"model": "m", "prompt": prompt + " next turn"}, ENGINES, now=0.0)
    assert again.engine == first.engine and again.overlap_of(first.engine) > 0
    # a still holds the first request's load: b sees it in the fleet-wide figures.
    assert await replicas.settle(lambda: b.core.loads.total(first.engine).requests == 1)
    await a.replica.node.stop(leave=False)  # a crash: no goodbye
    assert await replicas.settle(lambda: b.replica.peers()["dead"] == 1)
    assert b.core.loads.total(first.engine) == Load()
    assert overlap(b, prompt)[first.engine] > 0  # the engine still holds the blocks


async def test_replica_policy_changes_block_size_remote_deltas_reach_new_index(
    replicas: Replicas,
) -> None:
    a = await replicas.start("a")
    b = await replicas.start("b", seeds=("10.1.0.1:7946",))
    assert await replicas.settle(lambda: b.replica.peers()["alive"] == 1)
    for p in (a, b):
        text = "name: t\nblock_chars: 1024\nscorers: [{type: prefix-overlap, weight: 1}]\n"
        p.core.set_policy(load_policy_text(text, "t"))
    d = route(a)
    assert await replicas.settle(lambda: overlap(b)[str(d.engine)] > 0)


async def test_replica_metrics_exported_through_the_registry(replicas: Replicas) -> None:
    a = await replicas.start("a")
    b = await replicas.start("b", seeds=("10.1.0.1:7946",))
    route(a)
    assert await replicas.settle(lambda: b.replica.node.stats().counters.deltas_applied == 1)
    metrics = Metrics(
        FleetView(
            engines=lambda: (),
            local_load=lambda _e: Load(),
            index_entries=lambda: 0,
            gossip_peers=b.replica.peers,
            gossip=b.replica.samples,
        )
    )
    fams = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    peers = {s.labels["state"]: s.value for s in fams["kvrouter_gossip_peers"].samples}
    assert peers == {"alive": 1, "suspect": 0, "dead": 0}
    assert fams["kvrouter_gossip_rounds"].type == "counter"
    deltas = {s.labels["result"]: s.value for s in fams["kvrouter_gossip_deltas"].samples}
    assert deltas["applied"] == 1
    lag = fams["kvrouter_gossip_convergence_lag_seconds"].samples
    assert [s.labels["origin"].split("/")[0] for s in lag] == ["a"]
    await a.replica.node.stop(leave=False)
    assert await replicas.settle(lambda: State.DEAD in {m.state for m in b.replica.node.members()})
    # A dead origin's lag leaves the exposition: one series per process run would pile up.
    assert not any(s.name.endswith("convergence_lag_seconds") for s in b.replica.samples())
