"""One request's life in the gateway, in one place: the exchange.

    read body -> parse (its model alias rewritten, router.gateway.config.models) -> admission
    (router.gateway.inbound.admission: wait, bounded, while the fleet is full) -> decide ->
    for each engine of the plan (at most ``max_attempts``):
        acquire -> send -> first byte
            5xx, timeout, broken: release, try the next engine
            200: record the prefix for this engine, publish the delta -> relay -> release
            4xx: relayed as the engine's verdict on the request (nothing recorded)

``RoutingCore`` (router.core.decision) owns the state each step changes: ``decide`` is a query
returning a frozen decision with its ordered fallbacks; ``acquire`` takes the engine's load and
predicts the request's blocks there; ``record`` turns the prediction into an index entry when
the engine's first byte shows it took the prompt; ``release`` gives the load back on every exit
and withdraws a prediction never recorded, so a failed attempt leaves no belief behind.

Retries happen only while the client has no byte. A streamed answer (``text/event-stream``) is
relayed chunk by chunk as it arrives; once it has started, a failure ends it with an
error event in its API's shape and a clean close. Any other answer is read whole first (so it can
still be retried, and its ``usage`` read) and sent in one piece. Both relays are
router.gateway.upstream.relay's; how each ended is counted by router.gateway.settle, and
every failed attempt in one place (``_failed``). A client that disconnects
cancels the handler: the engine's connection is closed at once, which stops its generation,
and an engine that takes an abort is sent one (router.gateway.upstream.abort).

In a fleet with prefill and decode engines, ``decide`` is the core's disaggregated decision
(router.core.disaggregation); a request split between two engines is carried out by
router.gateway.disagg through these same attempts, failure counts and retry budget.

Requests go only to an engine's base URL (from config or DNS) plus the fixed API path of the
route; nothing in a request (path, query string, headers) chooses where it is sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence

from aiohttp import web

from router.core.decision import Lease
from router.core.precise import TokenPrompt
from router.core.verdict import Decision
from router.gateway import settle, stored_responses
from router.gateway.disagg import paths as disagg
from router.gateway.inbound.admission import priority_of, tenant_of
from router.gateway.inbound.auth import KEY_NAME
from router.gateway.inbound.body import read_body
from router.gateway.inbound.request_id import REQUEST_ID, request_id
from router.gateway.openai.errors import (
    EngineRefused,
    EngineVerdict,
    FirstByteTimeout,
    GatewayError,
    NoEngine,
    UpstreamError,
    UpstreamStatus,
    api_of,
    error_response,
)
from router.gateway.openai.request import Inbound
from router.gateway.receipt import RECEIPT, Receipt
from router.gateway.settle import CLIENT_GONE
from router.gateway.upstream import relay
from router.gateway.upstream.client import Upstream, UpstreamRequest, UpstreamResponse
from router.gateway.upstream.deadline import Deadline
from router.gateway.upstream.engine_errors import public_error
from router.gateway.upstream.headers import client_headers, engine_headers
from router.gateway.wiring import Services

log = logging.getLogger(__name__)

MAX_ERROR_BODY_BYTES = 1024 * 1024


def decide(
    s: Services,
    inbound: Inbound,
    headers: Mapping[str, str],
    tokenized: TokenPrompt | None = None,
    within: Collection[str] | None = None,
) -> Decision:
    """The core's decision for ``inbound`` among the engines serving its model (a query);
    ``within``: only those engines may be chosen (the endpoint picker's subset hint)."""
    core = s.core
    session = core.session_of(headers, inbound.body)
    # Asked again after admission on purpose: the wait may have changed who is healthy.
    cands = s.pool.candidates(inbound.model)
    if within is not None:
        cands = tuple(c for c in cands if c in within)
    cands = stored_responses.candidates(s.responses, inbound, cands)
    return core.decide(inbound.text, cands, s.clock(), session, tokenized=tokenized)


class Exchange:
    """One client request, from its body to its last byte; the one owner of its life."""

    def __init__(self, s: Services, request: web.Request, route: str) -> None:
        self.s = s
        self.request = request
        self.route = route
        self.api = api_of(route)  # the shape of its errors
        self.t0 = s.clock()
        self.status = 0  # what the client saw, for kvrouter_requests_total (0: not yet known)
        # The client has the whole answer (an event stream's [DONE] went out): a disconnect
        # after this point is the client being done, not the client giving up.
        self.delivered = False
        self.retries = 0  # granted by the retry budget, given back when the exchange ends
        # Names the request in client-facing errors and in every log line about it.
        self.id = request_id(request.headers.get("X-Request-Id", ""))
        request[REQUEST_ID] = self.id
        self.trace = s.tracing.request(request.headers, route, self.id)
        # What happened to it, for the access log and the routing-quality metrics.
        self.receipt = request[RECEIPT] = Receipt(self.id, route, self.t0)

    async def run(self) -> web.StreamResponse:
        """Serve the request; every failure becomes an OpenAI-shaped error response."""
        m = self.s.metrics
        try:
            with self.s.drain.exchange():
                resp = await self._serve()
            self.status = self.status or resp.status
            return resp
        except asyncio.CancelledError:
            if not self.delivered:
                self.status = CLIENT_GONE
            raise
        except Exception as exc:
            if not isinstance(exc, GatewayError):
                log.exception("%s: unexpected error on %s", self.id, self.route)
            elif isinstance(exc, UpstreamStatus):
                body = exc.body[:500].decode("utf-8", "replace")
                log.warning("%s: %s answered %d: %s", self.id, exc.engine, exc.engine_status, body)
            err = error_response(exc, request_id=self.id, api=self.api)
            self.status = err.status
            return err
        finally:
            m.requests.labels(self.route, str(self.status or 500)).inc()
            m.duration.observe(self.s.clock() - self.t0)
            self.trace.end(self.status or 500)
            self.s.receipts.close(self.receipt, self.status or 500, self.s.clock())

    async def _serve(self) -> web.StreamResponse:
        s = self.s
        raw = await read_body(self.request, s.limits.max_body_bytes)
        inbound, raw = s.aliases().rewrite(await s.bodies.parse(raw, self.route), raw)
        # Flow control: wait here (bounded) while every engine that could serve it is full.
        rules = s.admission.rules
        self.trace.admission()
        r = self.receipt
        r.model = inbound.model
        r.tenant = tenant_of(
            inbound.body, self.request.headers, rules.tenant_header, self.request.get(KEY_NAME)
        )
        r.queued_at = s.clock()
        await s.admission.enter(
            s.pool.candidates(inbound.model),
            priority_of(inbound.body, self.request.headers, rules.priority_header),
            r.tenant,
        )
        self.trace.admitted()
        r.admitted_at = s.clock()
        try:
            return await self._route(inbound, raw)
        finally:
            s.admission.leave()

    async def _route(self, inbound: Inbound, raw: bytes) -> web.StreamResponse:
        s = self.s
        tokenized = await s.tokenize(inbound) if s.tokenize is not None else None
        t = time.perf_counter()
        # Where prefill and decode may run apart, the core's disaggregated decision answers.
        split = disagg.decide(s, self.route, inbound, self.request.headers, tokenized)
        if split is None:
            d = decide(s, inbound, self.request.headers, tokenized)
        else:
            d = disagg.taken(s, split)
        s.metrics.decision.observe(time.perf_counter() - t)
        self.trace.decision(d, time.perf_counter() - t)
        self.receipt.decision = d
        if d.engine is None:
            raise NoEngine("no engine can take the request right now")
        s.metrics.overlap.observe(d.overlap_ratio)
        headers = engine_headers(
            self.request.headers,
            self.request.remote,
            request_id=self.id,
            pass_credentials=s.forwarding.client_credentials,
            trust_forwarding=s.forwarding.trust_forwarding_headers,
            own_trace_context=s.tracing.enabled,
        )
        plan = d.plan()[: max(1, s.limits.max_attempts)]
        if split is not None and split.path == "whole":
            plan = disagg.whole_plan(s, d, max(1, s.limits.max_attempts))
        # Request-shaped failures (see UpstreamError.request_shaped) wait here for a verdict:
        # the engine's fault if another engine answers, the request's if another fails too.
        suspects: list[tuple[str, UpstreamError]] = []
        s.retry_budget.enter()
        try:
            if split is not None and split.path == "split":
                return await disagg.run(self, split, raw, headers, suspects)
            # Where disaggregation applies, a whole answer loses the protocols' fields too.
            upstream = disagg.stripping(s) if split is not None else None
            return await self._attempts(d, plan, raw, headers, suspects, upstream=upstream)
        finally:
            s.retry_budget.leave(self.retries)

    async def _attempts(
        self,
        d: Decision,
        plan: Sequence[str],
        raw: bytes,
        headers: Sequence[tuple[str, str]],
        suspects: list[tuple[str, UpstreamError]],
        *,
        prefills: bool = True,  # False: the engines get the prompt's KV cache by transfer
        upstream: Upstream | None = None,  # what the attempts go through (s.upstream)
    ) -> web.StreamResponse:
        s = self.s
        for attempt, engine in enumerate(plan, 1):
            if attempt > 1:
                await self._before_retry(attempt, engine)
            self.receipt.attempt(engine, attempt)
            lease = s.core.acquire(d, engine, s.clock(), prefills=prefills)
            try:
                resp = await self._attempt(
                    lease, raw, [*headers, *self.trace.attempt(engine, attempt)], upstream
                )
            except UpstreamError as e:
                self.trace.attempt_end(e.label)
                # A request-shaped failure is blamed on its engine only once another answers.
                self._failed(engine, e, blame=not e.request_shaped)
                if e.request_shaped and suspects:
                    log.warning(
                        "%s %s: failed on %s (%s) and on %s (%s): the request's fault, not retried",
                        self.id, self.route, suspects[0][0], suspects[0][1], engine, e,
                    )  # fmt: skip
                    raise
                if e.request_shaped:
                    suspects.append((engine, e))
                if attempt == len(plan):
                    log.warning(
                        "%s %s: attempt %d at %s failed: %s",
                        self.id,
                        self.route,
                        attempt,
                        engine,
                        e,
                    )
                    # Nobody else was asked: count it, and let the ejection floor protect the
                    # fleet from a request that would fail anywhere.
                    self._blame(suspects)
                    raise
                continue
            finally:
                s.core.release(lease)
            self.trace.attempt_end(str(resp.status))
            self._blame(suspects)
            return resp
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _blame(self, suspects: list[tuple[str, UpstreamError]]) -> None:
        """Count request-shaped failures against their engines (another engine answered)."""
        for engine, e in suspects:
            self.s.pool.report_failure(engine, e.message, request_shaped=True)

    async def _before_retry(self, attempt: int, engine: str) -> None:
        """Spend from the retry budget (or give up), then wait a jittered backoff.

        A retry away from one failing engine to one that answers is free (see
        router.core.retry_budget): the budget holds only while much of the fleet fails.
        """
        s = self.s
        budget = s.retry_budget
        isolated = budget.isolated(engine, len(s.pool.engines), s.clock())
        if not isolated:
            if not budget.try_retry():
                s.metrics.retries_refused.inc()
                raise NoEngine("the gateway's retry budget is spent; try again shortly")
            self.retries += 1
        s.metrics.retries.inc()
        log.info(
            "%s %s: retrying on %s (attempt %d%s)",
            self.id, self.route, engine, attempt, ", one engine failing" if isolated else "",
        )  # fmt: skip
        pause = s.limits.retry_backoff_seconds * 2 ** (attempt - 2)
        if pause > 0:
            await asyncio.sleep(random.uniform(0, pause))

    def _first_byte(self, lease: Lease) -> None:
        """The engine took the prompt: record its blocks there and tell the peers."""
        self.s.retry_budget.answered(lease.engine)
        self.receipt.answered_at = self.s.clock()
        delta = self.s.core.record(lease, self.s.clock())
        if delta is not None:
            self.s.publish(delta)
        self.trace.first_byte()

    async def _attempt(
        self,
        lease: Lease,
        raw: bytes,
        headers: Sequence[tuple[str, str]],
        upstream: Upstream | None = None,
    ) -> web.StreamResponse:
        """One attempt at ``lease.engine``; ``UpstreamError`` while the client has no byte."""
        s, engine = self.s, lease.engine
        first_byte = s.timeouts.first_byte_seconds
        resp: UpstreamResponse | None = None
        finished = False  # the body was read to its end: the connection can be reused
        deadline = Deadline(min(first_byte, s.timeouts.idle_stream_seconds))
        s.drain.watch(deadline)
        payload, rid = s.aborts.tag(engine, self.route, raw, self.id)
        gone = False  # the client left (or the engine never started answering) mid-attempt
        try:
            deadline.start(first_byte)
            request = UpstreamRequest(engine, self.route, tuple(headers), payload)
            resp, first = await relay.first_bytes(
                upstream or s.upstream, request, deadline, first_byte, "response"
            )
            body = relay.Body(resp, engine, deadline, s.timeouts.idle_stream_seconds)
            if resp.status >= 500:
                whole = await body.rest(first, MAX_ERROR_BODY_BYTES)
                finished = True
                ctype = resp.headers.get("Content-Type", "application/json")
                raise UpstreamStatus(engine, resp.status, whole, ctype)
            if resp.status == 200:
                self._first_byte(lease)
                stored_responses.learn(s.responses, self.route, first, engine)
            ctype = resp.headers.get("Content-Type", "")
            if resp.status == 200 and ctype.startswith("text/event-stream") and first:
                answer = await relay.stream(self.request, body, first, self._first_sent)
                finished = await settle.stream(self, body, answer)
                return answer.response
            if resp.status >= 400:  # the engine's verdict on the request, relayed in shape
                whole = await body.rest(first, MAX_ERROR_BODY_BYTES)
                finished = True
                self._answered(engine, resp.status)
                if not relay.is_json_object(whole):
                    snippet = whole[:200].decode("utf-8", "replace")
                    log.warning("%s: %s refused with %d: %r", self.id, engine, resp.status, snippet)
                    raise EngineRefused(resp.status)
                return self._refused(resp, whole)
            answer = await relay.held(self.request, body, first, s.holds)
            finished = answer.complete
            settle.held(self, engine, resp.status, answer)
            return answer.response
        except (asyncio.CancelledError, FirstByteTimeout):
            gone = True
            raise
        finally:
            deadline.close()
            s.drain.forget(deadline)
            if resp is not None:
                if finished:
                    resp.release()
                else:
                    resp.abort()
            # Closing the connection stopped the engine; one that takes an abort gets it too.
            if rid is not None and not finished and (gone or self.status == CLIENT_GONE):
                s.aborts.send(engine, rid)

    def _refused(self, resp: UpstreamResponse, whole: bytes) -> web.Response:
        """An engine's 4xx JSON answer as the client gets it: by default its message alone,
        in the route's API shape (router.gateway.upstream.engine_errors), with the engine's
        status and its allowed headers (``Retry-After``...)."""
        headers = client_headers(resp.headers)
        if self.s.forwarding.engine_error_bodies == "verbatim":
            return web.Response(status=resp.status, body=whole, headers=headers)
        said = public_error(whole)
        verdict = EngineVerdict(resp.status, said.message, said.type, said.code)
        out = error_response(verdict, request_id=self.id, api=self.api)
        for k, v in headers.items():
            if k.lower() not in ("content-type", "x-request-id"):  # error_response sets its own
                out.headers.add(k, v)
        return out

    def _failed(self, engine: str, error: UpstreamError, *, blame: bool = True) -> None:
        """Count a failed attempt at ``engine``, and against its health unless not ``blame``."""
        self.s.metrics.engine_request(engine, error.label)
        self.s.retry_budget.failed(engine, self.s.clock())
        if blame:
            self.s.pool.report_failure(engine, error.message)

    def _answered(self, engine: str, status: int) -> None:
        self.s.metrics.engine_request(engine, str(status))
        self.s.retry_budget.answered(engine)
        self.s.pool.report_success(engine)

    def _first_sent(self) -> None:
        """The client has the stream's first bytes: its time to first token."""
        self.s.metrics.ttft.observe(self.s.clock() - self.t0)
