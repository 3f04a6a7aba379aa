"""The head sampler and the trace context readers agree with the OpenTelemetry SDK's own."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from router.gateway.config.tracing import SAMPLERS, TraceExport
from router.gateway.tracing.context import (
    MAX_TRACEPARENT,
    HeadSampler,
    parent_of,
    traceparent,
    tracestate_of,
)
from router.gateway.tracing.tracer import Tracing
from tests.otlp import Captured

PROPAGATOR = TraceContextTextMapPropagator()
ROUTE = "/v1/chat/completions"


def hex_of(lengths: list[int]) -> st.SearchStrategy[str]:
    return st.sampled_from(lengths).flatmap(
        lambda n: st.text(alphabet="0123456789abcdefABCDEF", min_size=n, max_size=n)
    )


# Near-valid headers: each part right or off by a little, so both readers are pushed on every
# rule (versions 00, ff and later ones, zero ids, upper case, padding, trailing fields).
traceparents = st.one_of(
    st.builds(
        lambda pad, v, t, s, f, tail: f"{pad}{v}-{t}-{s}-{f}{tail}",
        st.sampled_from(["", " ", "\t", "x"]),
        st.sampled_from(["00", "01", "ff", "0", "cc"]),
        st.one_of(hex_of([32, 31, 33]), st.just("0" * 32)),
        st.one_of(hex_of([16, 15]), st.just("0" * 16)),
        st.sampled_from(["00", "01", "02", "03", "ff", "1", "0g"]),
        st.sampled_from(["", " ", "\t ", "-", "-extra", " -x", "x"]),
    ),
    st.text(max_size=80),
    st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01" + " " * MAX_TRACEPARENT),
)


@given(traceparents)
def test_trace_context_reads_a_traceparent_as_the_sdk_does(value: str) -> None:
    theirs = trace.get_current_span(PROPAGATOR.extract({"traceparent": value})).get_span_context()
    ours = parent_of({"traceparent": value})
    if not theirs.is_valid:
        assert ours is None
        return
    assert ours is not None
    assert (ours.trace_id, ours.span_id, ours.sampled) == (
        theirs.trace_id,
        theirs.span_id,
        theirs.trace_flags.sampled,
    )


def sdk_sampler(name: str, ratio: float) -> Sampler:
    roots = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}
    root = roots.get(name.removeprefix("parentbased_")) or TraceIdRatioBased(ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


ids = st.integers(min_value=1, max_value=(1 << 128) - 1)


@given(
    st.sampled_from(SAMPLERS),
    st.floats(min_value=0.0, max_value=1.0),
    ids,
    st.none() | st.tuples(ids, st.integers(min_value=1, max_value=(1 << 64) - 1), st.booleans()),
)
def test_trace_context_samples_as_the_sdks_sampler_of_the_same_name(
    name: str, ratio: float, trace_id: int, parent_ids: tuple[int, int, bool] | None
) -> None:
    headers = {}
    if parent_ids is not None:
        tid, sid, sampled = parent_ids
        headers = {"traceparent": traceparent(tid, sid, sampled)}
        trace_id = tid
    context = PROPAGATOR.extract(headers) if headers else None
    theirs = sdk_sampler(name, ratio).should_sample(context, trace_id, "POST")
    assert HeadSampler(name, ratio).sampled(parent_of(headers), trace_id) is (
        theirs.decision is Decision.RECORD_AND_SAMPLE
    )


def test_trace_context_dropped_request_tells_the_engines_its_trace_unflagged() -> None:
    sent = Captured()
    tracing = Tracing(TraceExport("http://unused:4317", "grpc", "always_off", 0.0, "k"), sent)
    client = CIMultiDict(
        {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "vendor=opaque,bad key=x",
        }
    )
    first = dict(tracing.request(client, ROUTE, "rid").attempt("http://e", 1))
    alone = dict(tracing.request(CIMultiDict(), ROUTE, "rid2").attempt("http://e", 1))
    client["tracestate"] = "vendor=opaque"
    kept = dict(tracing.request(client, ROUTE, "rid3").attempt("http://e", 1))
    asyncio.run(tracing.close())
    assert sent.requests == []
    version, trace_id, span_id, flags = first["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "00")
    assert span_id not in ("00f067aa0ba902b7", "0" * 16)
    # The SDK reads a tracestate with an invalid member as none at all, so none is sent.
    assert "tracestate" not in first
    assert kept["tracestate"] == "vendor=opaque"
    assert set(alone) == {"traceparent"} and alone["traceparent"].endswith("-00")
    assert alone["traceparent"].split("-")[1] != trace_id


def test_trace_context_sampled_new_trace_keeps_the_id_it_was_sampled_by() -> None:
    sent = Captured()
    ratio = TraceExport("http://unused:4317", "grpc", "traceidratio", 0.5, "k")
    tracing = Tracing(ratio, sent)
    for n in range(64):
        tracing.request(CIMultiDict(), ROUTE, f"r{n}").end(200)
    asyncio.run(tracing.close())
    spans = sent.spans()
    bound = TraceIdRatioBased.get_bound_for_rate(0.5)
    assert 0 < len(spans) < 64  # both verdicts met in 64 draws (a chance of 2**-63 to fail)
    assert all(int(s.trace_id, 16) & (2**64 - 1) < bound for s in spans)
    assert len({s.trace_id for s in spans}) == len(spans)


# Near-valid tracestate members: keys and values at and past their limits and alphabets.
_state_keys = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_*/-]{0,8}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{1,4}@[a-z][a-z0-9]{0,14}", fullmatch=True),
    st.sampled_from(["", "A", "1a", "a" * 256, "a" * 257, "t@" + "s" * 14, "k y", "@x"]),
)
_state_values = st.one_of(
    st.from_regex(r"[!-+\--<>-~]{1,6}", fullmatch=True),
    st.sampled_from(["", " ", "x ", " x", "a=b", "a,b", "v" * 256, "v" * 257, "\x7f"]),
)
_members = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", _state_keys, _state_values),
    st.sampled_from(["", " ", "novalue", "="]),
)


@given(st.lists(_members, max_size=36), st.sampled_from([",", ", ", " ,\t"]))
def test_trace_context_reads_a_tracestate_as_the_sdk_does(members: list[str], sep: str) -> None:
    value = sep.join(members)
    theirs = TraceState.from_header([value])
    assert tracestate_of({"tracestate": value}) == theirs.to_header()
