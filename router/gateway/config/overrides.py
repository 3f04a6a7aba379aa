"""Command-line flags applied to a config: a flag replaces the file's value.

``with_overrides`` applies the engine, listen, policy and gossip flags, ``with_kv_events`` the
KV-event flags; a bad flag raises ``ConfigError`` naming the flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from router.core.disaggregation import Role
from router.core.fields import ConfigError
from router.gateway.config.engines import (
    DnsEngines,
    EngineSources,
    KvEventEndpoint,
    dns_target,
    engine_url,
    tokenizer_problem,
    zmq_endpoint,
)
from router.gateway.config.gossip import GossipSettings, gossip_dns, gossip_peer
from router.gateway.config.settings import Config


def with_overrides(
    cfg: Config,
    *,
    engines: list[str] | None = None,
    prefill: list[list[str]] | None = None,
    decode: list[str] | None = None,
    engine_dns: str | None = None,
    engine_api_key_env: str | None = None,
    policy: str | None = None,
    host: str | None = None,
    port: int | None = None,
    metrics_port: int | None = None,
    gossip_port: int | None = None,
    gossip_peers: list[str] | None = None,
    gossip_dns: str | None = None,
    gossip_advertise: str | None = None,
    gossip_node_id: str | None = None,
    gossip_preset: str | None = None,
) -> Config:
    """``cfg`` with command-line flags applied (a flag replaces the file's value)."""
    b = cfg.engines
    if engines or prefill or decode:
        b = _static_flags(b, engines or [], prefill or [], decode or [])
    if engine_dns:
        try:
            name, dport = dns_target(engine_dns)
        except ValueError as e:
            raise ConfigError(f"--engine-dns: {e}") from None
        # The flag names the one DNS name: the file's first gives the rest of its settings.
        old = b.dns[0] if b.dns else DnsEngines(name)
        b = dataclasses.replace(b, dns=(dataclasses.replace(old, name=name, port=dport),))
    if engine_api_key_env:
        b = dataclasses.replace(b, api_key_env=engine_api_key_env)
    listen = cfg.listen
    if host is not None:
        listen = dataclasses.replace(listen, host=host)
    if port is not None:
        listen = dataclasses.replace(listen, port=port)
    if metrics_port is not None:
        listen = dataclasses.replace(listen, metrics_port=metrics_port)
    gossip = gossip_overrides(
        cfg.gossip,
        port=gossip_port,
        peers=gossip_peers,
        dns=gossip_dns,
        advertise=gossip_advertise,
        node_id=gossip_node_id,
        preset=gossip_preset,
    )
    return dataclasses.replace(
        cfg, engines=b, listen=listen, policy=policy or cfg.policy, gossip=gossip
    )


def with_kv_events(
    cfg: Config,
    *,
    endpoints: list[str] | None = None,
    port: int | None = None,
    replay_port: int | None = None,
    tokenizer: str | None = None,
) -> Config:
    """``cfg`` with the KV-event flags applied (``--kv-events URL=tcp://H:P[,tcp://H:R]``)."""
    kv = cfg.engines.kv_events
    if endpoints:
        eps = dict(kv.endpoints)
        for spec in endpoints:
            url, sep, rest = spec.partition("=")
            ep, _, replay = rest.partition(",")
            try:
                if not sep:
                    raise ValueError(f"must be ENGINE_URL=tcp://HOST:PORT, got {spec!r}")
                key = engine_url(url)
                zmq_endpoint(ep)
                if replay:
                    zmq_endpoint(replay)
            except ValueError as e:
                raise ConfigError(f"--kv-events: {e}") from None
            eps[key] = KvEventEndpoint(ep, replay)
        kv = dataclasses.replace(kv, endpoints=eps)
    for flag, value in (("--kv-events-port", port), ("--kv-events-replay-port", replay_port)):
        if value is not None and not 0 < value < 65536:
            raise ConfigError(f"{flag}: must be from 1 to 65535, got {value}")
    if port is not None:
        kv = dataclasses.replace(kv, port=port)
    if replay_port is not None:
        kv = dataclasses.replace(kv, replay_port=replay_port)
    if tokenizer is not None:
        if (problem := tokenizer_problem(tokenizer)) is not None:
            raise ConfigError(f"--tokenizer: {problem}")
        kv = dataclasses.replace(kv, tokenizer=tokenizer)
    return dataclasses.replace(cfg, engines=dataclasses.replace(cfg.engines, kv_events=kv))


def _static_flags(
    b: EngineSources, engines: list[str], prefill: list[list[str]], decode: list[str]
) -> EngineSources:
    """``--engine``, ``--prefill URL [BOOTSTRAP_PORT]`` and ``--decode``: together they
    replace the file's static engines (the file's kinds, keys and, for ``--engine``, roles
    by URL still apply)."""
    urls: list[str] = []
    roles: dict[str, Role] = {}
    ports: dict[str, int] = {}

    def add(flag: str, text: str, role: Role | None) -> str:
        try:
            url = engine_url(text)
        except ValueError as e:
            raise ConfigError(f"{flag}: {e}") from None
        if url in urls:
            raise ConfigError(f"{flag}: {url} is given twice")
        urls.append(url)
        role = role or b.static_roles.get(url, "both")  # --engine: the file's role stands
        if role != "both":
            roles[url] = role
        return url

    for text in engines:
        add("--engine", text, None)
    for args in prefill:
        if len(args) > 2:
            raise ConfigError(f"--prefill: takes URL [BOOTSTRAP_PORT], got {' '.join(args)!r}")
        url = add("--prefill", args[0], "prefill")
        if len(args) == 2:
            if not args[1].isdigit() or not 0 < int(args[1]) < 65536:
                raise ConfigError(f"--prefill: the bootstrap port must be 1-65535: {args[1]!r}")
            ports[url] = int(args[1])
    for text in decode:
        add("--decode", text, "decode")
    return dataclasses.replace(
        b, static=tuple(urls), static_roles=roles, static_bootstrap_ports=ports
    )


def gossip_overrides(
    g: GossipSettings,
    *,
    port: int | None,
    peers: list[str] | None,
    dns: str | None,
    advertise: str | None,
    node_id: str | None,
    preset: str | None,
) -> GossipSettings:
    """The gossip flags applied: ``--gossip-port`` turns gossip on; the others need it on."""
    if port is not None:
        if not 0 < port < 65536:
            raise ConfigError(f"--gossip-port: must be from 1 to 65535, got {port}")
        g = dataclasses.replace(g, enabled=True, port=port)
    given = {
        "--gossip-peer": peers,
        "--gossip-dns": dns,
        "--gossip-advertise": advertise,
        "--gossip-node-id": node_id,
        "--gossip-preset": preset,
    }
    used = [flag for flag, value in given.items() if value]
    if used and not g.enabled:
        raise ConfigError(
            f"{used[0]} needs gossip on: give --gossip-port P (or gossip.enabled in the config)"
        )
    if peers:
        seeds = tuple(_flag("--gossip-peer", gossip_peer, p) for p in peers)
        g = dataclasses.replace(g, peers=seeds)
    if dns:
        g = dataclasses.replace(g, dns=_flag("--gossip-dns", gossip_dns, dns))
    if advertise:
        g = dataclasses.replace(g, advertise=_flag("--gossip-advertise", gossip_peer, advertise))
    if node_id:
        g = dataclasses.replace(g, node_id=node_id)
    if preset:
        g = dataclasses.replace(g, preset=preset)
    return g


def _flag(flag: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except ValueError as e:
        raise ConfigError(f"{flag}: {e}") from None
