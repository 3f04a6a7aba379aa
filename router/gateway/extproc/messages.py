"""The endpoint picker protocol over Envoy's ext_proc messages: what is read, what is sent.

Pure functions over the protos of the ``xds-protos`` package, like router.gateway.openai.sse
over bytes: router.gateway.extproc.stream calls them, tests build and read messages with
them. The names are the Gateway API Inference Extension's (its proposal
004-endpoint-picker-protocol):

- the pick: the header ``x-gateway-destination-endpoint`` set by a header mutation, and the
  dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``, both the same ordered
  ``ip:port,ip:port`` list (the proposal forbids the two to differ; the first is the pick);
- the subset hint, from the request's ``metadata_context``: ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset``, a list of ``ip:port``;
- the endpoint that served, in the response phase: ``envoy.lb`` /
  ``x-gateway-destination-endpoint-served`` (or a response header of that name);
- a refusal: an ``ImmediateResponse`` with the HTTP status and an OpenAI error body;
- a split request (prefill and decode apart, router.core.disaggregation): the pick is the
  decode engine, and ``x-prefiller-host-port`` names the prefill engine's ``ip:port``, as
  llm-d's routing sidecar beside the decode engine reads it (it runs vLLM's protocol from
  there). A client's own value never reaches the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from google.protobuf import struct_pb2

from router.gateway.extproc.pb import envoy_config_core_v3_base_pb2 as base_pb2
from router.gateway.extproc.pb import (
    envoy_extensions_filters_http_ext_proc_v3_processing_mode_pb2 as processing_mode_pb2,
)
from router.gateway.extproc.pb import envoy_service_ext_proc_v3_external_processor_pb2 as ep
from router.gateway.extproc.pb import envoy_type_v3_http_status_pb2 as http_status_pb2

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
FAIRNESS = "x-gateway-inference-fairness-id"
OBJECTIVE = "x-gateway-inference-objective"
MODEL_REWRITE = "x-gateway-model-name-rewrite"
PREFILLER = "x-prefiller-host-port"
# Read by the picker and not the engine's business: removed from the request Envoy sends on.
CONTROL_HEADERS = (FAIRNESS, OBJECTIVE, MODEL_REWRITE, SERVED)

BodyMode = processing_mode_pb2.ProcessingMode.BodySendMode
FULL_DUPLEX_STREAMED = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
NONE = processing_mode_pb2.ProcessingMode.NONE
# Answers kept built (``pick_answer``): more than the orders of three engines out of twenty.
PICK_ANSWERS = 8192


def headers_of(h: ep.HttpHeaders) -> dict[str, str]:
    """A headers message as a dict of lower-case names (pseudo-headers included); Envoy sends
    values as ``raw_value`` bytes (``value`` in older releases). Repeated names are joined."""
    out: dict[str, str] = {}
    for hv in h.headers.headers:
        value = hv.raw_value.decode("utf-8", "surrogateescape") if hv.raw_value else hv.value
        key = hv.key.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


def _field(md: ep.ProcessingRequest, namespace: str, key: str) -> struct_pb2.Value | None:
    meta = md.metadata_context.filter_metadata
    if namespace not in meta or key not in meta[namespace].fields:
        return None
    return meta[namespace].fields[key]


def subset_hint(req: ep.ProcessingRequest) -> tuple[str, ...] | None:
    """The endpoints the request may go to (``ip:port``), or None when Envoy set no hint.

    A list of strings, or one string of comma-separated endpoints; anything else is an empty
    subset (which no endpoint is in).
    """
    v = _field(req, SUBSET_NAMESPACE, SUBSET)
    if v is None:
        return None
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        return tuple(x.string_value.strip() for x in v.list_value.values if x.string_value)
    if kind == "string_value":
        return tuple(p.strip() for p in v.string_value.split(",") if p.strip())
    return ()


def served(req: ep.ProcessingRequest, headers: Mapping[str, str]) -> str | None:
    """The endpoint that answered (``ip:port``), from the response's metadata or headers."""
    v = _field(req, LB_NAMESPACE, SERVED)
    if v is not None and v.string_value:
        first: str = v.string_value.split(",")[0].strip()
        return first
    named = headers.get(SERVED, "").split(",")[0].strip()
    return named or None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("utf-8", "surrogateescape")),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def pick_metadata(endpoints: Sequence[str]) -> struct_pb2.Struct:
    """The ``envoy.lb`` dynamic metadata naming the ordered endpoints."""
    md = struct_pb2.Struct()
    md.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = ",".join(endpoints)
    return md


def pick_mutation(
    endpoints: Sequence[str], content_length: int | None, prefiller: str | None = None
) -> ep.HeaderMutation:
    """The request's headers for Envoy to send on: the pick set, the picker's own removed,
    the length of a body the picker rewrote, and a split's prefill engine (else none: a
    client cannot name one)."""
    sets = [_header(DESTINATION, ",".join(endpoints))]
    if content_length is not None:
        sets.append(_header("content-length", str(content_length)))
    removed = list(CONTROL_HEADERS)
    if prefiller is None:
        removed.append(PREFILLER)
    else:
        sets.append(_header(PREFILLER, prefiller))
    return ep.HeaderMutation(set_headers=sets, remove_headers=removed)


def request_headers_answer(
    mutation: ep.HeaderMutation | None = None, metadata: struct_pb2.Struct | None = None
) -> ep.ProcessingResponse:
    """The answer to the request's headers; with a pick, it clears the route cache so that
    Envoy routes again on the header it sets."""
    common = ep.CommonResponse()
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
        common.clear_route_cache = True
    resp = ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common))
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


def request_body_answer(
    *,
    streamed: bytes | None = None,
    end_of_stream: bool = False,
    replace: bytes | None = None,
    mutation: ep.HeaderMutation | None = None,
    metadata: struct_pb2.Struct | None = None,
) -> ep.ProcessingResponse:
    """An answer to a request body message.

    ``streamed``: the bytes Envoy sends on in full-duplex streamed mode (there, Envoy forwards
    only what the answers carry). ``replace``: a buffered body's new bytes. ``mutation``: the
    pick's headers, allowed here in buffered mode since Envoy holds the headers back until
    the body's answer.
    """
    common = ep.CommonResponse()
    if streamed is not None:
        common.body_mutation.streamed_response.body = streamed
        common.body_mutation.streamed_response.end_of_stream = end_of_stream
    elif replace is not None:
        common.body_mutation.body = replace
    if mutation is not None:
        common.header_mutation.CopyFrom(mutation)
        common.clear_route_cache = True
    resp = ep.ProcessingResponse(request_body=ep.BodyResponse(response=common))
    if metadata is not None:
        resp.dynamic_metadata.CopyFrom(metadata)
    return resp


@functools.lru_cache(maxsize=PICK_ANSWERS)
def pick_answer(endpoints: tuple[str, ...], full_duplex: bool) -> ep.ProcessingResponse:
    """The answer naming ``endpoints`` for a body handed back unchanged: to the headers in
    full-duplex streamed mode, to the body in buffered mode.

    Shared and never to be changed: a plan is one of few orders of few engines, and building
    the message costs a third of a decision, so each is built once.
    """
    mutation, metadata = pick_mutation(endpoints, None), pick_metadata(endpoints)
    if full_duplex:
        return request_headers_answer(mutation, metadata)
    return request_body_answer(mutation=mutation, metadata=metadata)


def request_trailers_answer() -> ep.ProcessingResponse:
    return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())


def response_headers_answer() -> ep.ProcessingResponse:
    return ep.ProcessingResponse(response_headers=ep.HeadersResponse())


def response_body_answer(streamed: bytes | None, end_of_stream: bool) -> ep.ProcessingResponse:
    """A response body chunk passed on unchanged (``streamed``: full-duplex mode's copy)."""
    common = ep.CommonResponse()
    if streamed is not None:
        common.body_mutation.streamed_response.body = streamed
        common.body_mutation.streamed_response.end_of_stream = end_of_stream
    return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))


def response_trailers_answer() -> ep.ProcessingResponse:
    return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


def immediate(
    status: int, body: bytes, headers: Mapping[str, str], details: str
) -> ep.ProcessingResponse:
    """Envoy answers the client itself with ``status`` and ``body``, and sends nothing on."""
    sets = [_header(k, v) for k, v in headers.items()]
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ep.HeaderMutation(set_headers=sets),
            body=body,
            details=details,
        )
    )
