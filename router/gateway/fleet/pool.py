"""The engine pool: which engines exist, which are healthy, and which models each serves.

Engines come from static URLs and from a DNS name re-resolved every interval (each address is
one engine, as behind a Kubernetes headless Service). Each engine's model list comes from its
``GET /v1/models``, refreshed. Health is active and passive:

- a probe (``GET health.path``) every interval; a pending engine turns healthy on its first
  success;
- failures (probes, and proxied requests that failed to connect, timed out, broke off or got a
  5xx) are counted; ``eject_after_failures`` in a row eject the engine;
- an ejected engine is probed on; once its backoff has passed, a successful probe readmits it.
  Each ejection and each failed trial doubles the backoff (up to the maximum); an engine that
  stays healthy for the maximum backoff starts again from the base.

Only healthy engines that serve the model are routing candidates. An ejected engine stays known
to the router (``RoutingCore.set_engines`` lists every known engine), so its index entries are kept
and count again when it returns; an engine that leaves DNS is dropped with its entries.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.core.disaggregation import Role
from router.gateway.config.engines import DnsEngines, EngineSources
from router.gateway.config.settings import HealthSettings
from router.gateway.openai.errors import NoEngine, NotFound, UpstreamError
from router.gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]


class State(enum.Enum):
    PENDING = "pending"  # not yet seen healthy
    HEALTHY = "healthy"
    EJECTED = "ejected"


@dataclass(slots=True)
class Health:
    """One engine's health record; changed only by ``HealthRules``."""

    state: State = State.PENDING
    failures: int = 0  # consecutive
    readmit_at: float = 0.0
    backoff: float = 0.0  # the wait after the next ejection or failed trial
    healthy_since: float = 0.0


class HealthRules:
    """Health transitions: pure functions of a record, an event and the time."""

    def __init__(self, cfg: HealthSettings) -> None:
        self.cfg = cfg

    def success(self, h: Health, now: float, probe: bool) -> bool:
        """Record a success; True when it made the engine healthy."""
        if h.state is State.HEALTHY:
            h.failures = 0
            if now - h.healthy_since >= self.cfg.readmit_backoff_max_seconds:
                h.backoff = self.cfg.readmit_backoff_seconds
            return False
        # Only a probe readmits: a request that started before the ejection proves little.
        if h.state is State.EJECTED and (not probe or now < h.readmit_at):
            return False
        h.state, h.failures, h.healthy_since = State.HEALTHY, 0, now
        return True

    def failure(self, h: Health, now: float, probe: bool, may_eject: bool = True) -> bool:
        """Record a failure; True when it ejected the engine (only when ``may_eject``)."""
        h.failures += 1
        base, top = self.cfg.readmit_backoff_seconds, self.cfg.readmit_backoff_max_seconds
        wait = h.backoff or base
        if h.state is State.HEALTHY and h.failures >= self.cfg.eject_after_failures and may_eject:
            h.state, h.readmit_at, h.backoff = State.EJECTED, now + wait, min(2 * wait, top)
            return True
        if h.state is State.EJECTED and probe and now >= h.readmit_at:
            h.readmit_at, h.backoff = now + wait, min(2 * wait, top)
        return False


@dataclass(slots=True)
class Engine:
    """One engine: its base URL, where it came from, its health and its models."""

    url: str
    source: str  # "static", "pods", or a DNS name's "dns:NAME"
    health: Health = field(default_factory=Health)
    # None until the first model list arrived: until then it is no candidate for any model.
    models: dict[str, dict[str, Any]] | None = None

    @property
    def healthy(self) -> bool:
        return self.health.state is State.HEALTHY


# What of an engine's model card clients see: OpenAI's fields, and the context length (vLLM,
# SGLang). The rest (vLLM's root, the weights' path; permissions) is the engines' business.
CARD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "object": str,
    "created": int,
    "owned_by": str,
    "max_model_len": int,
}


def public_card(card: dict[str, Any]) -> dict[str, Any]:
    """``card`` with only the ``CARD_FIELDS`` of the right type."""
    return {
        k: v
        for k, v in card.items()
        if k in CARD_FIELDS and isinstance(v, CARD_FIELDS[k]) and not isinstance(v, bool)
    }


def parse_models(body: bytes) -> dict[str, dict[str, Any]]:
    """An OpenAI model list -> {model id: its public card}; raises ``ValueError`` saying why."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("no 'data' array")
    out: dict[str, dict[str, Any]] = {}
    for card in items:
        if isinstance(card, dict) and isinstance(card.get("id"), str) and card["id"]:
            out[card["id"]] = public_card(card)
    return out


def url_for(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


async def resolve_dns(name: str, port: int) -> list[str]:
    """Every address of ``name`` (A and AAAA), sorted; raises ``OSError`` on failure."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return sorted({str(info[4][0]) for info in infos})


class EnginePool:
    """Known engines, their health and models; the routing candidates for a model."""

    def __init__(
        self,
        cfg: EngineSources,
        health: HealthSettings,
        upstream: Upstream,
        on_engines: Callable[[Mapping[str, int]], None],
        clock: Callable[[], float] = time.monotonic,
        resolver: Resolver = resolve_dns,
    ) -> None:
        self.cfg = cfg
        self.health_cfg = health
        self.rules = HealthRules(health)
        self._upstream = upstream
        self._on_engines = on_engines
        self._clock = clock
        self._resolver = resolver
        self._engines: dict[str, Engine] = {}
        self._by_model: dict[str, tuple[str, ...]] = {}
        self._models_body: bytes | None = None
        self._aliases: Mapping[str, str] = {}  # listed as models (router.gateway.config.models)
        # Bumped on every change of health or models: readers cache what they derive from it.
        self.version = 0
        self._roles: dict[str, Role] | None = None
        self._set_engines_from({u: "static" for u in cfg.static})

    # -- reading -----------------------------------------------------------------------------

    @property
    def engines(self) -> Mapping[str, Engine]:
        return self._engines

    def ready(self) -> bool:
        """True when at least one engine is healthy and has told its models."""
        return any(b.healthy and b.models is not None for b in self._engines.values())

    def _source(self, url: str) -> str:
        b = self._engines.get(url)
        return b.source if b is not None else "static"

    def kind_of(self, url: str) -> str:
        """How the engine at ``url`` takes an abort (router.gateway.config.engines)."""
        return self.cfg.kind_of(url, self._source(url))

    def role_of(self, url: str) -> Role:
        """The engine's role: prefill, decode or both (router.core.disaggregation)."""
        return self.cfg.role_of(url, self._source(url))

    def bootstrap_port_of(self, url: str) -> int | None:
        """An SGLang prefill engine's bootstrap port (None: unknown)."""
        return self.cfg.bootstrap_port_of(url, self._source(url))

    def roles(self) -> Mapping[str, Role]:
        """The known engines whose role is not both (asked per request: kept until the
        engines change)."""
        if self._roles is None:
            self._roles = {}
            for url, b in self._engines.items():
                role = self.cfg.role_of(url, b.source)
                if role != "both":
                    self._roles[url] = role
        return self._roles

    def candidates(self, model: str) -> tuple[str, ...]:
        """Healthy engines serving ``model``; raises ``NotFound`` or ``NoEngine``."""
        found = self._by_model.get(model)
        if found:
            return found
        if any(b.models is not None and model in b.models for b in self._engines.values()):
            raise NoEngine(f"no healthy engine serves model '{model}' right now")
        if not self.ready():
            raise NoEngine("no healthy engine right now")
        raise NotFound(
            f"The model '{model}' does not exist on any engine.", "model", "model_not_found"
        )

    def models_body(self) -> bytes:
        """``GET /v1/models``: the union of the healthy engines' models, and each alias whose
        model one of them serves (that model's card, under the alias), as JSON bytes."""
        if self._models_body is None:
            cards: dict[str, dict[str, Any]] = {}
            for b in self._engines.values():
                if b.healthy and b.models:
                    for mid, card in b.models.items():
                        cards.setdefault(mid, card)
            for alias, served in self._aliases.items():
                if served in cards:
                    cards[alias] = {**cards[served], "id": alias}
            data = [cards[m] for m in sorted(cards)]
            self._models_body = orjson.dumps({"object": "list", "data": data})
        return self._models_body

    # -- changes -----------------------------------------------------------------------------

    def set_aliases(self, aliases: Mapping[str, str]) -> None:
        """The model aliases ``/v1/models`` lists from now on (alias -> served name)."""
        self._aliases = aliases
        self._models_body = None

    def _changed(self) -> None:
        by_model: dict[str, list[str]] = {}
        for b in self._engines.values():
            if b.healthy and b.models:
                for mid in b.models:
                    by_model.setdefault(mid, []).append(b.url)
        self._by_model = {m: tuple(urls) for m, urls in by_model.items()}
        self._models_body = None
        self.version += 1

    def _set_engines_from(self, wanted: Mapping[str, str]) -> None:
        """Make the known engines exactly ``wanted`` (url -> source), keeping known records."""
        if set(wanted) == set(self._engines):
            return
        for url in set(self._engines) - set(wanted):
            log.info("engine %s removed", url)
            del self._engines[url]
        for url, source in wanted.items():
            if url not in self._engines:
                log.info("engine %s added (%s)", url, source)
                self._engines[url] = Engine(url, source)
        self._roles = None
        self._on_engines(dict.fromkeys(self._engines, 1))
        self._changed()

    def set_addresses(self, source: str, urls: Iterable[str]) -> None:
        """Discovery ``source`` (a DNS name's, pods) now finds ``urls``; static engines and
        other sources' engines stay."""
        wanted = {u: "static" for u in self.cfg.static}
        for u, b in self._engines.items():
            if b.source != source:
                wanted.setdefault(u, b.source)
        for u in urls:
            wanted.setdefault(u, source)
        self._set_engines_from(wanted)

    def report_success(self, url: str, probe: bool = False) -> None:
        """A request (or probe) to ``url`` succeeded."""
        b = self._engines.get(url)
        if b is not None and self.rules.success(b.health, self._clock(), probe):
            log.info("engine %s is healthy", url)
            self._changed()

    def report_failure(
        self, url: str, reason: str, probe: bool = False, request_shaped: bool = False
    ) -> None:
        """A request (or probe) to ``url`` failed: counts towards ejection.

        ``request_shaped`` evidence (a 5xx or a timeout, which a bad request can cause on every
        engine) never ejects so many engines that more than ``max_ejected_percent`` of the
        fleet, or the last healthy one, is out.
        """
        b = self._engines.get(url)
        if b is None:
            return
        may_eject = not request_shaped or self._may_eject_one()
        if self.rules.failure(b.health, self._clock(), probe, may_eject):
            log.warning(
                "engine %s ejected after %d failures in a row (last: %s); retry in %.3gs",
                url,
                b.health.failures,
                reason,
                b.health.readmit_at - self._clock(),
            )
            self._changed()

    def _may_eject_one(self) -> bool:
        known = len(self._engines)
        healthy = sum(1 for b in self._engines.values() if b.healthy)
        out_after = known - (healthy - 1)
        return healthy > 1 and out_after * 100 <= self.health_cfg.max_ejected_percent * known

    def set_models(self, url: str, models: dict[str, dict[str, Any]]) -> None:
        b = self._engines.get(url)
        if b is None:
            return
        if b.models is None or set(b.models) != set(models):
            log.info("engine %s serves %s", url, ", ".join(sorted(models)) or "no models")
        b.models = models
        self._changed()

    # -- background work ---------------------------------------------------------------------

    async def probe(self, b: Engine) -> None:
        """Probe one engine's health; fetch its models when it has none yet."""
        url = b.url
        try:
            status, _ = await self._upstream.fetch(
                url, self.health_cfg.path, self.health_cfg.timeout_seconds
            )
        except UpstreamError as e:
            self.report_failure(url, e.message, probe=True)
            return
        if status != 200:
            self.report_failure(url, f"health probe answered {status}", probe=True)
            return
        if b.models is None:
            await self.refresh_models(b)
        self.report_success(url, probe=True)

    async def refresh_models(self, b: Engine) -> None:
        """Fetch one engine's model list; keep the old one when that fails."""
        url = b.url + "/v1/models"
        try:
            status, body = await self._upstream.fetch(
                b.url, "/v1/models", self.health_cfg.timeout_seconds
            )
            if status != 200:
                raise ValueError(f"status {status}")
            models = parse_models(body)
        except (UpstreamError, ValueError) as e:
            log.warning("GET %s failed: %s", url, e)
            return
        self.set_models(b.url, models)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(b) for b in list(self._engines.values())))

    async def refresh_all_models(self) -> None:
        await asyncio.gather(*(self.refresh_models(b) for b in list(self._engines.values())))

    async def resolve_once(self) -> None:
        """Resolve every DNS name; keep a name's last answer when its resolution fails."""
        for dns in self.cfg.dns:
            await self._resolve(dns)

    async def _resolve(self, dns: DnsEngines) -> None:
        try:
            addresses = await self._resolver(dns.name, dns.port)
        except OSError as e:
            log.warning("cannot resolve %s: %s; keeping %d engines", dns.name, e, len(self))
            return
        if not addresses:
            log.warning("%s resolved to no address; keeping the engines", dns.name)
            return
        self.set_addresses(dns.source, (url_for(dns.scheme, a, dns.port) for a in addresses))

    def __len__(self) -> int:
        return len(self._engines)

    async def health_loop(self) -> None:
        """Probe every engine every interval, forever."""
        while True:
            await self.probe_all()
            await asyncio.sleep(self.health_cfg.interval_seconds)

    async def models_loop(self) -> None:
        """Refresh every engine's model list every interval, forever."""
        while True:
            await asyncio.sleep(self.cfg.models_refresh_seconds)
            await self.refresh_all_models()

    async def dns_loop(self) -> None:
        """Re-resolve the DNS names every interval, forever (a new engine is probed at once)."""
        if not self.cfg.dns:
            return
        interval = min(d.interval_seconds for d in self.cfg.dns)
        while True:
            before = set(self._engines)
            await self.resolve_once()
            fresh = [b for u, b in self._engines.items() if u not in before]
            if fresh:
                await asyncio.gather(*(self.probe(b) for b in fresh))
            await asyncio.sleep(interval)
