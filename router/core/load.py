"""In-flight load per engine: what this replica has sent, what its peers report, and what the
engines themselves report.

The bounded-load cap and the load scorers must see the whole fleet's load, not one replica's
share of it, so peers' figures (per origin, replaced wholesale by each peer report,
``peer_report``) are summed with the local counters. A peer that dies takes its figures with it
(``forget_peer``).

An engine's own report (``EngineReport``: requests running and waiting, KV cache in use, read
from its /metrics, given to ``engine_report``) also sees work no router replica sent or knows
of, its peers' included. It is blended with this replica's figures so that its age neither
double-counts nor forgets what was just sent: the engine's requests at the report's time T,
minus this replica's requests that were in flight at T and have finished since, plus this
replica's requests sent after T still in flight; never less than this replica's own figure.
While an engine's report is fresh, the peers' figures for it are not added: they come late (a
load interval and a gossip hop), and count each request until its lease is given back, which
for an endpoint picker is two more round trips after the engine's answer; summed over several
replicas, that made the busiest engines, the deepest holders, look busier than they were, and
four gossiping pickers left them for it (bench/RESULTS.md, "Several pickers: the peers' load
set aside where the engine reports its own": 0.122-0.126 hit ratio with the peers' figures,
0.133-0.137 without). A report older than ``stale_after`` seconds is ignored: then, as for an
engine that never reported, the fleet's figure is this replica's own plus its peers'.

An engine's batch has a limit no metric names (vLLM's ``max_num_seqs``, or what its KV cache
fits): a report with requests waiting shows it, as the requests then running. The book learns
it from two such reports in a row (and raises it on any report running more), so that between
scrapes it knows when what it sent since has filled the batch: the next request would wait for
a slot, however stale the report's "nobody waiting" is (the backlog ``signals`` gives).

A hot prefix's heat (``HotPrefix``: the requests in flight behind one prefix key) is load
too, and each replica sees only its own share of it. Local heat follows ``acquire`` and
``release``; each peer reports its hottest few prefixes (``hottest``), summed like the rest.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add, itemgetter


@dataclass(frozen=True, slots=True)
class Load:
    """In-flight requests, and the prompt tokens of those still waiting for their prefill."""

    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineReport:
    """What an engine says of itself: requests in its batch, requests queued, KV cache in use."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # from 0 to 1

    @property
    def requests(self) -> int:
        return self.running + self.waiting


# A report is trusted this long by default: a few scrape intervals of the gateway's default.
DEFAULT_STALE_AFTER_SECONDS = 2.0
# A replica's hottest prefixes in each load report, and the most taken from a peer's. A
# prefix spreads once a few requests per holder are in flight behind it, so only the hottest
# few can be near that; the cap bounds what a peer's report can make this replica hold.
HOT_PREFIXES = 32


class _Reported:
    """An engine's last report and the traffic since it was taken."""

    __slots__ = ("at", "done", "report", "since")

    def __init__(self, report: EngineReport, at: float, since: int) -> None:
        self.report = report
        self.at = at
        self.since = since  # local requests sent after ``at``, still in flight
        self.done = 0  # local requests in flight at ``at`` that have finished since

    def requests(self) -> int:
        """The engine's requests now, by this report and this replica's traffic since."""
        return self.report.running + self.report.waiting - self.done + self.since


class LoadBook:
    """Local in-flight counters per engine, each peer's latest report and each engine's own."""

    def __init__(self, stale_after: float = DEFAULT_STALE_AFTER_SECONDS) -> None:
        self.stale_after = stale_after
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._remote: dict[str, Mapping[str, Load]] = {}
        # Sums of all peers' reports per engine, rebuilt when a peer report arrives, so that
        # reading a load on the routing path costs two dict lookups; and the tokens' sums for
        # the engines with no fresh report of their own (``_unreported``), the ones decisions add.
        self._remote_requests: dict[str, int] = {}
        self._remote_tokens: dict[str, int] = {}
        self._remote_tokens_unreported: dict[str, int] = {}
        # When each local request in flight was sent, per engine (to place it against a
        # report's time), and the engines' own reports.
        self._sent: dict[str, list[float]] = {}
        self._reported: dict[str, _Reported] = {}
        # ``_Reported.requests`` of the fresh reports, kept current as requests come and go,
        # so that blending them into the fleet's figures is one pass in C (``requests``).
        # Stale reports leave it when ``_oldest`` (at most the oldest one's time) passes
        # ``stale_after``.
        self._blend: dict[str, int] = {}
        self._oldest = float("inf")
        # Each engine's batch limit, as its reports with requests waiting showed it.
        self._slots: dict[str, int] = {}
        # Requests in flight per prefix key: this replica's, each peer's hottest, their sum.
        self._heat: dict[int, int] = {}
        self._remote_heat: dict[str, dict[int, int]] = {}
        self._remote_heat_sum: dict[int, int] = {}

    def acquire(
        self, engine: str, tokens: int, now: float = 0.0, prefix: int | None = None
    ) -> None:
        """Count a request sent to ``engine`` at ``now`` with ``tokens`` to prefill (behind
        ``prefix``, the key whose heat it adds to)."""
        if prefix is not None:
            self._heat[prefix] = self._heat.get(prefix, 0) + 1
        self._requests[engine] = self._requests.get(engine, 0) + 1
        self._tokens[engine] = self._tokens.get(engine, 0) + tokens
        self._sent.setdefault(engine, []).append(now)
        r = self._reported.get(engine)
        if r is not None and now > r.at:
            r.since += 1
            self._reblend(engine, r)

    def prefilled(self, engine: str, tokens: int) -> None:
        """``tokens`` that ``acquire`` counted on ``engine`` are prefilled: no longer queued."""
        t = self._tokens.get(engine)
        if t is not None:
            self._tokens[engine] = max(0, t - tokens)

    def release(
        self, engine: str, tokens: int, sent_at: float = 0.0, prefix: int | None = None
    ) -> None:
        """Give back what ``acquire`` (at ``sent_at``) took; counters never go below zero."""
        if prefix is not None:
            n = self._heat.pop(prefix, 0) - 1
            if n > 0:
                self._heat[prefix] = n
        sent = self._sent.get(engine)
        if sent:
            try:
                sent.remove(sent_at)
            except ValueError:
                sent.pop()
            r = self._reported.get(engine)
            if r is not None:
                if sent_at > r.at:
                    r.since = max(0, r.since - 1)
                else:
                    r.done += 1
                self._reblend(engine, r)
        n = self._requests.get(engine, 0) - 1
        t = self._tokens.get(engine, 0) - tokens
        if n <= 0:
            self._requests.pop(engine, None)
            self._tokens.pop(engine, None)
            self._sent.pop(engine, None)
        else:
            self._requests[engine] = n
            self._tokens[engine] = max(0, t)

    def local(self, engine: str) -> Load:
        return Load(self._requests.get(engine, 0), self._tokens.get(engine, 0))

    def local_all(self) -> dict[str, Load]:
        return {e: Load(n, self._tokens.get(e, 0)) for e, n in self._requests.items()}

    def requests(self, engines: Sequence[str], now: float | None = None) -> list[int]:
        """Fleet-wide in-flight requests for each of ``engines``, in order.

        With ``now``, engines' fresh reports stand in for the peers' figures (see the module
        docstring).
        """
        # Every engine of the fleet is read on each decision: these loops run in C.
        own = list(map(self._requests.get, engines, repeat(0)))
        fleet = own
        if self._remote_requests:
            fleet = list(map(add, own, map(self._remote_requests.get, engines, repeat(0))))
        if now is None or not self._reported:
            return fleet
        if now - self._oldest > self.stale_after:
            self._drop_stale(now)
        # A fresh report's blend, never below this replica's own; the fleet's figure elsewhere.
        return list(map(max, own, map(self._blend.get, engines, fleet)))

    def tokens(self, engines: Iterable[str]) -> list[int]:
        """Prompt tokens awaiting prefill for each of ``engines``, in order: this replica's,
        and its peers' where the engine has no fresh report (as of the last ``requests``)."""
        own = map(self._tokens.get, engines, repeat(0))
        if self._remote_tokens_unreported:
            own = map(add, own, map(self._remote_tokens_unreported.get, engines, repeat(0)))
        return list(own)

    def total(self, engine: str) -> Load:
        return Load(
            self._requests.get(engine, 0) + self._remote_requests.get(engine, 0),
            self._tokens.get(engine, 0) + self._remote_tokens.get(engine, 0),
        )

    def engine_report(self, engine: str, report: EngineReport, at: float) -> None:
        """``engine``'s own figures as they were at ``at`` (when the scrape was sent)."""
        since = sum(1 for t in self._sent.get(engine, ()) if t > at)
        last = self._reported.get(engine)
        r = self._reported[engine] = _Reported(report, at, since)
        self._blend[engine] = r.requests()
        self._remote_tokens_unreported.pop(engine, None)
        # A bound below every fresh report's time; made exact again by ``_drop_stale``.
        self._oldest = min(self._oldest, at)
        known = self._slots.get(engine)
        if report.waiting and report.running and last is not None and last.report.waiting:
            # Full: the batch takes this many now. One report with a queue is not enough: a
            # request that arrived during the engine's current step waits one step in any
            # engine, full or not.
            self._slots[engine] = report.running
        elif known is not None and report.running > known:
            self._slots[engine] = report.running  # it took more than it was seen full at

    def slots(self, engine: str) -> int | None:
        """``engine``'s batch limit as its reports showed it (None: never seen full)."""
        return self._slots.get(engine)

    def reporting_engines(self) -> tuple[str, ...]:
        """Engines with a report, fresh or stale."""
        return tuple(self._reported)

    def drop_engine_report(self, engine: str) -> None:
        """Forget ``engine``'s report (it left, or stopped reporting)."""
        self._reported.pop(engine, None)
        self._blend.pop(engine, None)
        self._slots.pop(engine, None)
        self._unreported_tokens()

    def engine_reported(self, engine: str, now: float) -> EngineReport | None:
        """``engine``'s own last report (``engine_report``) if fresh at ``now``, else None."""
        r = self._fresh(engine, now)
        return None if r is None else r.report

    def queued(self, engine: str, now: float) -> int | None:
        """Requests waiting inside ``engine`` now, by its fresh report (None: no report).

        Each of this replica's requests that finished since the report let one waiting request
        into the batch: a queue of one seen at the moment a slot changed hands is gone, not a
        queue.
        """
        r = self._fresh(engine, now)
        if r is None:
            return None
        return max(0, r.report.waiting - r.done)

    def _backlog(self, engine: str, r: _Reported) -> int:
        """Where a request sent to ``engine`` now would stand: 0, it starts at once; k, it
        waits for k batch slots to free.

        The engine's queue (``queued``) and, once its batch limit is known (``slots``), what
        this router sent since the report, which fills the batch and then the queue.
        """
        rep = r.report
        queued = max(0, rep.waiting - r.done)
        slots = self._slots.get(engine)
        if slots is None:
            return queued
        return max(queued, r.requests() - slots + 1)

    def _reblend(self, engine: str, r: _Reported) -> None:
        if engine in self._blend:
            self._blend[engine] = r.requests()

    def _drop_stale(self, now: float) -> None:
        reported, stale = self._reported, self.stale_after
        # The same test as ``_fresh``, to the last bit of the float.
        for e in [e for e in self._blend if now - reported[e].at > stale]:
            del self._blend[e]
        self._oldest = min((reported[e].at for e in self._blend), default=float("inf"))
        self._unreported_tokens()

    def _unreported_tokens(self) -> None:
        blend = self._blend
        self._remote_tokens_unreported = {
            e: t for e, t in self._remote_tokens.items() if e not in blend
        }

    def _fresh(self, engine: str, now: float) -> _Reported | None:
        r = self._reported.get(engine)
        return None if r is None or now - r.at > self.stale_after else r

    def signals(self, engines: Sequence[str], now: float) -> tuple[list[int], list[float]]:
        """Per engine, in order: its backlog, the batch slots a request sent now would wait
        for (0 unknown), and its KV cache use (0 unknown)."""
        if not self._reported:
            return [0] * len(engines), [0.0] * len(engines)
        waiting: list[int] = []
        usage: list[float] = []
        for e in engines:
            r = self._fresh(e, now)
            waiting.append(0 if r is None else self._backlog(e, r))
            usage.append(r.report.kv_usage if r is not None else 0.0)
        return waiting, usage

    def heat(self, prefix: int) -> int:
        """Requests in flight behind ``prefix``, over this replica and its peers."""
        return self._heat.get(prefix, 0) + self._remote_heat_sum.get(prefix, 0)

    def hottest(self, n: int) -> dict[int, int]:
        """This replica's ``n`` hottest prefixes and their heat, for its peers."""
        return dict(heapq.nlargest(n, self._heat.items(), key=itemgetter(1)))

    def peer_report(
        self, origin: str, loads: Mapping[str, Load], heat: Mapping[int, int] | None = None
    ) -> None:
        """Replace peer ``origin``'s figures (and its hottest prefixes) with its latest report."""
        self._remote[origin] = dict(loads)
        self._remote_heat[origin] = {k: n for k, n in (heat or {}).items() if n > 0}
        self._resum()

    def forget_peer(self, origin: str) -> None:
        """Drop a peer's figures (it died or left)."""
        if self._remote.pop(origin, None) is not None:
            self._remote_heat.pop(origin, None)
            self._resum()

    def _resum(self) -> None:
        req: dict[str, int] = {}
        tok: dict[str, int] = {}
        for loads in self._remote.values():
            for e, ld in loads.items():
                req[e] = req.get(e, 0) + ld.requests
                tok[e] = tok.get(e, 0) + ld.tokens
        self._remote_requests, self._remote_tokens = req, tok
        self._unreported_tokens()
        heat: dict[int, int] = {}
        for hot in self._remote_heat.values():
            for k, n in hot.items():
                heat[k] = heat.get(k, 0) + n
        self._remote_heat_sum = heat
