"""One ext_proc stream's life: one HTTP request Envoy asks the picker about, in one place.

    request headers (protocol_config in the first message names the body modes)
        buffered: answer at once (Envoy waits for it before sending the body)
        full duplex streamed: hold the answer until the body is whole
    request body chunks, up to end_of_stream (or the trailers)
        -> parse -> admission -> decide -> acquire the pick  (the proxy's steps,
           router.gateway.exchange, with the same core calls in the same order)
        -> the pick: header mutation + envoy.lb dynamic metadata (the plan, in order)
        -> refused: an ImmediateResponse (400s, 429 shed, 503 nothing can serve)
    response headers: the endpoint that served; the lease moves to it if Envoy fell back;
        200 -> record the prefix (the first byte), publish the delta (a split request: on its
        prefill engine too, whose answer the decode engine's first byte implies)
    response body chunks -> the usage tail (counted, and the engine's prompt count against
        the router's calibrates the core); end_of_stream (or the trailers) -> release
        (with response_body_mode NONE, the response's headers are its end)
    the stream ends before that (Envoy reset it, or closed it early) -> release what is held

Where prefill and decode run apart, the pick is router.gateway.disagg's decision: a whole
path's plan kept to engines that answer alone, or a split's decode engine with the prefill
engine named in a header (router.gateway.extproc.messages) and leased too.

Every exit releases the leases and leaves admission exactly once (``close``). In full-duplex
streamed mode Envoy forwards only the body bytes the answers carry, so the request body goes
back whole once the pick is made (in chunks of ``CHUNK_BYTES``), and each response chunk is
passed back as it comes.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import orjson

from router.core.decision import Lease
from router.core.verdict import Decision
from router.gateway.disagg import paths as disagg
from router.gateway.exchange import decide
from router.gateway.extproc import messages as msg
from router.gateway.extproc.endpoints import Endpoints
from router.gateway.extproc.metrics import EppMetrics
from router.gateway.extproc.pb import envoy_service_ext_proc_v3_external_processor_pb2 as ep
from router.gateway.inbound.admission import priority_of, tenant_of
from router.gateway.openai.errors import (
    BadRequest,
    BodyTooLarge,
    GatewayError,
    NoEngine,
    NotFound,
    error_response,
)
from router.gateway.openai.request import PROMPT_FIELD, json_object
from router.gateway.settle import GENERATION_ROUTES
from router.gateway.upstream.headers import UsageTail
from router.gateway.wiring import Services

log = logging.getLogger(__name__)

# Envoy's own buffer for one body message is 64 KiB; larger answers are split like its own.
CHUNK_BYTES = 64 * 1024
CLIENT_GONE = 499
# The answers to one message, in order; built as they are sent (see ``_chunks``).
Answers = Iterable[ep.ProcessingResponse]


class Unsupported(Exception):
    """A body mode the picker cannot pick in: the stream ends with FAILED_PRECONDITION."""


@dataclass
class Picker:
    """What every stream shares: the gateway's services, endpoints, metrics."""

    s: Services
    endpoints: Endpoints
    metrics: EppMetrics
    # Requests without a body (no prompt to route on) take turns over the candidates.
    turns: itertools.count[int] = field(default_factory=itertools.count)
    clock: Callable[[], float] = time.perf_counter


class Phase(enum.Enum):
    REQUEST = "request"
    RESPONSE = "response"
    DONE = "done"


class PickerStream:
    """One request as Envoy's ext_proc filter presents it; ``on`` per message, then ``close``."""

    def __init__(self, p: Picker) -> None:
        self.p = p
        self.s = p.s
        self.t0 = self.s.clock()
        self.full_duplex = False  # request body mode
        self.response_streamed = False  # response body mode is full duplex streamed
        self.response_headers_only = False
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.chunks: list[bytes] = []  # the request body so far
        self.size = 0
        self.route = ""
        self.decision: Decision | None = None
        self.lease: Lease | None = None
        self.prefill_lease: Lease | None = None  # a split request's prefill engine
        self.admitted = False
        self.phase = Phase.REQUEST
        self.status = 0
        self.event_stream = False
        self.tail = UsageTail()
        self._first = True

    # -- the messages ------------------------------------------------------------------------

    async def on(self, req: ep.ProcessingRequest) -> Answers:
        """The answers to one message from Envoy, in order (often none yet)."""
        if self._first:
            self._first = False
            self._modes(req)
        kind = req.WhichOneof("request") or ""
        if self.phase is Phase.DONE and not kind.startswith("response_"):
            return []  # refused already: Envoy sends nothing more of the request
        handler = self._HANDLERS.get(kind)
        if handler is None:
            return []  # nothing to answer (e.g. observability-mode extras)
        return await handler(self, req)

    def _modes(self, req: ep.ProcessingRequest) -> None:
        if not req.HasField("protocol_config"):
            return  # an Envoy before protocol_config: buffered, its default for the picker
        pc = req.protocol_config
        mode = pc.request_body_mode
        if mode not in (msg.BUFFERED, msg.FULL_DUPLEX_STREAMED, msg.NONE):
            name = msg.BodyMode.Name(mode)
            raise Unsupported(
                f"request_body_mode {name}: the picker needs the whole body before Envoy "
                "routes; configure BUFFERED or FULL_DUPLEX_STREAMED"
            )
        self.full_duplex = mode == msg.FULL_DUPLEX_STREAMED
        self.response_streamed = pc.response_body_mode == msg.FULL_DUPLEX_STREAMED
        # Envoy sends no response body: the response's headers are all the picker sees of it.
        self.response_headers_only = pc.response_body_mode == msg.NONE

    async def _request_headers(self, req: ep.ProcessingRequest) -> Answers:
        self.headers = msg.headers_of(req.request_headers)
        hint = msg.subset_hint(req)
        if hint is not None:
            self.subset = self.p.endpoints.engines_at(hint)
        self.route = self.headers.get(":path", "").partition("?")[0]
        if req.request_headers.end_of_stream:
            return self._headers_only()
        if self.full_duplex:
            return []  # answered with the pick, once the body is whole
        return [msg.request_headers_answer()]

    async def _request_body(self, req: ep.ProcessingRequest) -> Answers:
        if self.decision is not None:
            return []  # after the pick nothing more is read (Envoy sends nothing either)
        chunk = req.request_body
        data = chunk.body
        self.chunks.append(data)
        self.size += len(data)
        if self.size > self.s.limits.max_body_bytes:
            limit = self.s.limits.max_body_bytes
            return self._refuse(BodyTooLarge(f"request body is larger than {limit} bytes"))
        # Buffered, Envoy sends the body whole in one message and waits for its answer
        # (end_of_stream is false only when trailers follow); streamed, the last one says so.
        if self.full_duplex and not chunk.end_of_stream:
            return []
        return await self._pick()

    async def _request_trailers(self, req: ep.ProcessingRequest) -> Answers:
        out = () if self.decision is not None else await self._pick()
        if self.phase is Phase.DONE:
            return out
        return itertools.chain(out, (msg.request_trailers_answer(),))

    async def _response_headers(self, req: ep.ProcessingRequest) -> Answers:
        if self.phase is not Phase.DONE:
            self.phase = Phase.RESPONSE
        h = msg.headers_of(req.response_headers)
        try:
            self.status = int(h.get(":status", "0"))
        except ValueError:
            self.status = 0
        self.event_stream = h.get("content-type", "").startswith("text/event-stream")
        self._served(msg.served(req, h))
        if req.response_headers.end_of_stream or self.response_headers_only:
            self._finish()
        return [msg.response_headers_answer()]

    async def _response_body(self, req: ep.ProcessingRequest) -> Answers:
        chunk = req.response_body
        self.tail.feed(chunk.body)
        answer = msg.response_body_answer(
            chunk.body if self.response_streamed else None, chunk.end_of_stream
        )
        if chunk.end_of_stream:
            self._finish()
        return [answer]

    async def _response_trailers(self, req: ep.ProcessingRequest) -> Answers:
        self._finish()
        return [msg.response_trailers_answer()]

    _HANDLERS: Mapping[str, Callable[[PickerStream, ep.ProcessingRequest], Awaitable[Answers]]]

    # -- the pick ----------------------------------------------------------------------------

    async def _pick(self) -> Answers:
        t = self.p.clock()
        raw = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks = []
        try:
            endpoints, body = await self._decide(raw)
        except GatewayError as e:
            return self._refuse(e)
        m = self.p.metrics
        prefiller = self._prefiller()
        if body is None and prefiller is None:
            pick = msg.pick_answer(tuple(endpoints), self.full_duplex)
        else:
            mutation = msg.pick_mutation(endpoints, None if body is None else len(body), prefiller)
            metadata = msg.pick_metadata(endpoints)
            pick = (
                msg.request_headers_answer(mutation, metadata)
                if self.full_duplex
                else msg.request_body_answer(replace=body, mutation=mutation, metadata=metadata)
            )
        m.answer.observe(self.p.clock() - t)
        if not self.full_duplex:
            m.buffered.inc()
            return (pick,)
        m.full_duplex.inc()
        # The pick goes first: Envoy can open the engine's connection while the body's copies
        # are built and sent after it.
        return itertools.chain((pick,), _chunks(body if body is not None else raw))

    async def _decide(self, raw: bytes) -> tuple[list[str], bytes | None]:
        """The plan's endpoints, and the body rewritten (None: unchanged); holds the lease."""
        s = self.s
        if self.route not in PROMPT_FIELD:
            raise NotFound(f"no route for POST {self.route}", code="not_found")
        rewritten: bytes | None = None
        model = self.headers.get(msg.MODEL_REWRITE, "").strip()
        if model:
            body = json_object(raw)
            body["model"] = model
            rewritten = raw = orjson.dumps(body)
        inbound = await s.bodies.parse(raw, self.route)
        cands = self._candidates(inbound.model)
        rules = s.admission.rules
        headers = self.headers
        await s.admission.enter(
            cands, self._priority(inbound.body, rules.priority_header), self._tenant(inbound.body)
        )
        self.admitted = True
        tokenized = await s.tokenize(inbound) if s.tokenize is not None else None
        t = time.perf_counter()
        split = disagg.decide(s, self.route, inbound, headers, tokenized, within=self.subset)
        d = decide(s, inbound, headers, tokenized, within=self.subset) if split is None else (
            disagg.taken(s, split)
        )  # fmt: skip
        s.metrics.decision.observe(time.perf_counter() - t)
        if d.engine is None:
            raise NoEngine("no engine can take the request right now")
        s.metrics.overlap.observe(d.overlap_ratio)
        limit = max(1, s.limits.max_attempts)
        apart = split is not None and split.path == "split"
        # A split's fallbacks are other decode engines, with the same prefill engine.
        whole = split is not None and not apart
        plan = disagg.whole_plan(s, d, limit) if whole else d.plan()[:limit]
        endpoints = [e for e in map(self.p.endpoints.endpoint_of, plan) if e is not None]
        if self.p.endpoints.endpoint_of(d.engine) is None:
            raise NoEngine(f"the engine picked, {d.engine}, has no address yet")
        self.decision = d
        if apart:
            assert split is not None and split.prefill is not None
            prefill = split.prefill_engine
            if prefill is None or self.p.endpoints.endpoint_of(prefill) is None:
                raise NoEngine(f"the prefill engine picked, {prefill}, has no address yet")
            self.prefill_lease = s.core.acquire(split.prefill, prefill, s.clock())
        self.lease = s.core.acquire(d, d.engine, s.clock(), prefills=not apart)
        return endpoints, rewritten

    def _prefiller(self) -> str | None:
        """A split request's prefill engine as ``ip:port`` (None: not split)."""
        lease = self.prefill_lease
        return None if lease is None else self.p.endpoints.endpoint_of(lease.engine)

    def _candidates(self, model: str) -> tuple[str, ...]:
        cands = self.s.pool.candidates(model)
        if self.subset is not None:
            cands = tuple(c for c in cands if c in self.subset)
            if not cands:
                raise NoEngine("no endpoint of the request's subset hint can serve it")
        return cands

    def _priority(self, body: Mapping[str, object], header: str) -> int:
        """The objective header as the Inference Extension means it (higher is more
        important, below 0 sheddable) turned to the queue's order (lower goes first); else
        the gateway's own priority header or the body's."""
        objective = self.headers.get(msg.OBJECTIVE, "").strip()
        if objective.lstrip("-").isdigit():
            return priority_of({}, {header: str(-int(objective))}, header)
        return priority_of(body, self.headers, header)

    def _tenant(self, body: Mapping[str, object]) -> str:
        fairness = self.headers.get(msg.FAIRNESS, "").strip()
        if fairness:
            return fairness[:128]
        return tenant_of(body, self.headers, self.s.admission.rules.tenant_header)

    def _headers_only(self) -> Answers:
        """A request without a body (a GET): no prompt, so the candidates take turns."""
        healthy = [u for u, e in self.s.pool.engines.items() if e.healthy]
        if self.subset is not None:
            healthy = [u for u in healthy if u in self.subset]
        found = [e for e in map(self.p.endpoints.endpoint_of, healthy) if e is not None]
        if not found:
            return self._refuse(NoEngine("no healthy engine right now"))
        turn = next(self.p.turns) % len(found)
        endpoints = found[turn:] + found[:turn]
        self.p.metrics.headers_only.inc()
        self.decision = None
        self.phase = Phase.RESPONSE
        return [
            msg.request_headers_answer(
                msg.pick_mutation(endpoints, None), msg.pick_metadata(endpoints)
            )
        ]

    def _refuse(self, e: GatewayError) -> Answers:
        """Envoy answers the client with ``e`` in OpenAI's shape; the stream is over."""
        if isinstance(e, BadRequest | NotFound | BodyTooLarge):
            log.info("epp %s: refused with %d: %s", self.route, e.status, e.message)
        else:
            log.warning("epp %s: refused with %d: %s", self.route, e.status, e.message)
        resp = error_response(e)
        assert isinstance(resp.body, bytes)
        headers = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
        self.p.metrics.immediate.labels(str(resp.status)).inc()
        self.status = resp.status
        self._finish()
        return [msg.immediate(resp.status, resp.body, headers, f"kvrouter_{e.code or e.type}")]

    # -- the response ------------------------------------------------------------------------

    def _served(self, endpoint: str | None) -> None:
        """The response's endpoint: the lease follows it; a 200 records the prefix there."""
        s, d, lease = self.s, self.decision, self.lease
        if d is None or lease is None:
            return
        engine = self.p.endpoints.engine_of(endpoint) if endpoint else None
        if engine is None:
            self.p.metrics.served_unknown.inc()
        elif engine == lease.engine:
            self.p.metrics.served_pick.inc()
        else:
            # Envoy went down the list: the pick failed it, the fallback holds the request.
            self.p.metrics.served_fallback.inc()
            s.pool.report_failure(lease.engine, "Envoy fell back from it", request_shaped=True)
            s.core.release(lease)
            prefills = self.prefill_lease is None
            self.lease = lease = s.core.acquire(d, engine, s.clock(), prefills=prefills)
        s.metrics.engine_request(lease.engine, str(self.status))
        if self.status == 200:
            for held in (self.prefill_lease, lease):
                if held is not None:
                    delta = s.core.record(held, s.clock())
                    if delta is not None:
                        s.publish(delta)
            s.pool.report_success(lease.engine)

    def _finish(self) -> None:
        """The response ended: usage counted, load given back."""
        if self.phase is Phase.DONE:
            return
        d = self.decision
        if self.status == 200 and self.route in GENERATION_ROUTES and self.lease is not None:
            counts = self.tail.usage() if self.event_stream else self.tail.json_usage()
            if counts is not None and d is not None:
                self.s.metrics.usage(*counts)
                # The engine's count of the prompt against the router's, as the proxy's
                # exchange gives it: the engines' cache sizes are read in the router's tokens.
                self.s.core.calibrate(d.prompt_tokens, counts[0])
        self._end()

    def close(self) -> None:
        """The stream is over: release whatever is held. Before the response's end, Envoy
        reset it (the client or the engine went away) or gave up on it."""
        if self.phase is not Phase.DONE:
            self.p.metrics.resets.labels(self.phase.value).inc()
            self.status = self.status or CLIENT_GONE
            self._end()

    def _end(self) -> None:
        s = self.s
        self.phase = Phase.DONE
        for held in (self.prefill_lease, self.lease):
            if held is not None:
                s.core.release(held)
        self.lease = self.prefill_lease = None
        if self.admitted:
            self.admitted = False
            s.admission.leave()
        if self.route in PROMPT_FIELD:  # a client's path is no label: only the known routes
            s.metrics.requests.labels(self.route, str(self.status or 500)).inc()
            s.metrics.duration.observe(s.clock() - self.t0)


PickerStream._HANDLERS = {
    "request_headers": PickerStream._request_headers,
    "request_body": PickerStream._request_body,
    "request_trailers": PickerStream._request_trailers,
    "response_headers": PickerStream._response_headers,
    "response_body": PickerStream._response_body,
    "response_trailers": PickerStream._response_trailers,
}


def _chunks(body: bytes) -> Iterator[ep.ProcessingResponse]:
    """The request body handed back to Envoy in full-duplex streamed mode, the last chunk
    marked ``end_of_stream``; each built when it is sent."""
    if len(body) <= CHUNK_BYTES:
        yield msg.request_body_answer(streamed=body, end_of_stream=True)
        return
    for i in range(0, len(body), CHUNK_BYTES):
        end = i + CHUNK_BYTES >= len(body)
        yield msg.request_body_answer(streamed=body[i : i + CHUNK_BYTES], end_of_stream=end)
