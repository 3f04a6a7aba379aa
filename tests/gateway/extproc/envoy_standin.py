"""Envoy's ext_proc filter, as it drives an endpoint picker, from the same protos.

No Envoy binary can be installed where the tests run, so ``ExtProcFilter`` plays the filter's
side of one ``ExternalProcessor.Process`` stream, one HTTP request per stream, the way Envoy
does it. Each behaviour, and where it was read:

- One gRPC stream per HTTP request; ``protocol_config`` (the body modes) only in the stream's
  first message (api/envoy/service/ext_proc/v3/external_processor.proto,
  ProcessingRequest.protocol_config: "sent only in the first message").
- Pseudo-headers (``:method``, ``:path``, ``:authority``, ``:scheme``; ``:status`` in the
  response) travel as headers, names lower-case, values in ``raw_value``
  (envoy.config.core.v3.HeaderValue; source/extensions/filters/http/ext_proc/mutation_utils.cc
  builds them so).
- ``metadata_context``: the filter metadata namespaces it is configured to forward
  (ext_proc.proto ``metadata_options.forwarding_namespaces``), here the subset hint with the
  request headers and ``envoy.lb`` with the response headers, as the inference extension's
  proposal 004-endpoint-picker-protocol places them.
- BUFFERED: the filter waits for the answer to the headers before it sends the body, then
  sends the whole body in one message, ``end_of_stream`` true unless trailers follow, and
  waits for its answer; header mutations in that answer still apply, since the headers have
  not gone upstream (processing_mode.proto, BodySendMode BUFFERED; ext_proc.cc
  ``Filter::decodeData``).
- FULL_DUPLEX_STREAMED: headers and every body chunk go out as they arrive, without waiting;
  the processor answers the headers first, then sends the body back in ``streamed_response``
  pieces, the last one ``end_of_stream``; what it does not send back is not forwarded
  (processing_mode.proto, BodySendMode FULL_DUPLEX_STREAMED; ext_proc.cc
  ``Filter::onReceiveMessage`` and processor_state.cc for the order).
- A last, empty chunk may carry only ``end_of_stream`` (HttpBody.end_of_stream_without_message
  names the case where no message would otherwise be sent).
- ``immediate_response`` at any point ends the exchange: Envoy answers the client with it and
  forwards nothing (ext_proc.cc ``Filter::onReceiveMessage``, ``sendImmediateResponse``).
- ``mode_override`` is honoured only with ``allow_mode_override`` in the filter's config, only in
  an answer to headers, and not when a body mode is FULL_DUPLEX_STREAMED (ext_proc.proto
  ``allow_mode_override``; ext_proc.cc's handling of ``mode_override``).
- The response phase: ``:status`` and the response headers, then the body per
  ``response_body_mode`` (full duplex: each chunk echoed back in ``streamed_response``), then
  trailers when ``response_trailer_mode`` is SEND.
- When processing is over the filter closes its side of the stream; when the HTTP request is
  destroyed first (the client or the upstream reset), the gRPC stream is reset: the picker
  sees a cancelled RPC (ext_proc.cc ``Filter::onDestroy``, ``closeStream``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from router.gateway.extproc import messages as msg
from router.gateway.extproc.pb import envoy_config_core_v3_base_pb2 as base_pb2
from router.gateway.extproc.pb import (
    envoy_extensions_filters_http_ext_proc_v3_processing_mode_pb2 as processing_mode_pb2,
)
from router.gateway.extproc.pb import envoy_service_ext_proc_v3_external_processor_pb2 as ep
from router.gateway.extproc.pb import (
    envoy_service_ext_proc_v3_external_processor_pb2_grpc as ep_grpc,
)

Mode = processing_mode_pb2.ProcessingMode
BUFFERED = Mode.BUFFERED
FULL_DUPLEX = Mode.FULL_DUPLEX_STREAMED
# Envoy hands body data on as it reads it; 16 KiB is a typical read.
CHUNK_BYTES = 16 * 1024
ANSWER_TIMEOUT = 10.0


@dataclass(frozen=True)
class FilterConfig:
    """The ext_proc filter's processing mode, as an InferencePool's gateway sets it."""

    request_body_mode: int = FULL_DUPLEX
    response_body_mode: int = FULL_DUPLEX
    response_header_mode: int = Mode.SEND
    response_trailer_mode: int = Mode.SKIP
    send_protocol_config: bool = True
    allow_mode_override: bool = False
    chunk_bytes: int = CHUNK_BYTES


@dataclass
class Routed:
    """What Envoy does with the request after the picker: where to, with what."""

    headers: dict[str, str]
    body: bytes
    metadata: dict[str, Any]
    immediate: ep.ImmediateResponse | None = None
    mode_overrides: list[Any] = field(default_factory=list)

    @property
    def destination(self) -> str | None:
        """The endpoint list the picker named (header and metadata must agree)."""
        return self.headers.get(msg.DESTINATION)

    @property
    def endpoints(self) -> list[str]:
        lb = self.metadata.get(msg.LB_NAMESPACE, {})
        value = lb.get(msg.DESTINATION, "")
        return [e for e in str(value).split(",") if e]


def header_map(headers: Mapping[str, str]) -> ep.HttpHeaders:
    hm = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k.lower(), raw_value=v.encode()) for k, v in headers.items()
        ]
    )
    return hm


def metadata(namespace: str, key: str, value: Any) -> base_pb2.Metadata:
    md = base_pb2.Metadata()
    s = struct_pb2.Struct()
    s.update({key: value})
    md.filter_metadata[namespace].CopyFrom(s)
    return md


def _struct(s: struct_pb2.Struct) -> dict[str, Any]:
    out: dict[str, Any] = MessageToDict(s)
    return out


def _apply(headers: dict[str, str], mutation: ep.HeaderMutation) -> None:
    for name in mutation.remove_headers:
        headers.pop(name.lower(), None)
    for opt in mutation.set_headers:
        value = opt.header.raw_value.decode() if opt.header.raw_value else opt.header.value
        headers[opt.header.key.lower()] = value


class ExtProcFilter:
    """One HTTP request's ext_proc stream, driven as Envoy's filter drives it."""

    def __init__(self, channel: grpc.aio.Channel, config: FilterConfig | None = None) -> None:
        self.config = config or FilterConfig()
        self.call: Any = ep_grpc.ExternalProcessorStub(channel).Process()
        self._first = True
        self.routed: Routed | None = None

    def _message(self, **fields: Any) -> ep.ProcessingRequest:
        req = ep.ProcessingRequest(**fields)
        if self._first and self.config.send_protocol_config:
            req.protocol_config.CopyFrom(
                ep.ProtocolConfiguration(
                    request_body_mode=self.config.request_body_mode,
                    response_body_mode=self.config.response_body_mode,
                )
            )
        self._first = False
        return req

    async def send(self, req: ep.ProcessingRequest) -> None:
        """Write one message; when the picker has ended the stream, its status is raised."""
        try:
            await self.call.write(req)
        except grpc.aio.AioRpcError:
            # A write racing the picker's end fails on its own; the stream's status says why.
            code, details = await self.call.code(), await self.call.details()
            raise grpc.aio.AioRpcError(
                code, grpc.aio.Metadata(), grpc.aio.Metadata(), details
            ) from None

    async def answer(self) -> ep.ProcessingResponse:
        """The picker's next answer; AssertionError when the stream ended instead."""
        got = await asyncio.wait_for(self.call.read(), ANSWER_TIMEOUT)
        assert got is not grpc.aio.EOF, "the picker ended the stream without an answer"
        return got

    def _body_chunks(self, body: bytes) -> list[bytes]:
        n = self.config.chunk_bytes
        return [body[i : i + n] for i in range(0, len(body), n)] or [b""]

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        subset: Sequence[str] | None = None,
        subset_value: Any = None,
        end_early: bool = False,
    ) -> Routed:
        """The request phase; ``end_early``: close the stream before the body's end."""
        h = {":method": method, ":path": path, ":authority": "gateway", ":scheme": "http"}
        h.update({k.lower(): v for k, v in headers.items()})
        if body:
            h["content-length"] = str(len(body))
        md = None
        if subset is not None or subset_value is not None:
            value = list(subset) if subset is not None else subset_value
            md = metadata(msg.SUBSET_NAMESPACE, msg.SUBSET, value)
        kwargs: dict[str, Any] = {
            "request_headers": ep.HttpHeaders(headers=header_map(h), end_of_stream=not body)
        }
        if md is not None:
            kwargs["metadata_context"] = md
        await self.send(self._message(**kwargs))
        routed = Routed(dict(h), b"", {})
        self.routed = routed
        if not body:
            return await self._headers_answer(routed)
        if self.config.request_body_mode != FULL_DUPLEX:
            # Every mode but full duplex waits for the headers' answer before the body.
            await self._headers_answer(routed)
            if routed.immediate is not None:
                return routed
            if end_early:
                await self.call.done_writing()
                return routed
            await self.send(self._message(request_body=ep.HttpBody(body=body, end_of_stream=True)))
            a = await self.answer()
            if self._immediate(a, routed):
                return routed
            common = a.request_body.response
            _apply(routed.headers, common.header_mutation)
            routed.body = common.body_mutation.body if common.HasField("body_mutation") else body
            self._metadata(a, routed)
            return routed
        chunks = self._body_chunks(body)
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            if end_early and last:
                await self.call.done_writing()
                return routed
            await self.send(self._message(request_body=ep.HttpBody(body=chunk, end_of_stream=last)))
        await self._headers_answer(routed)
        if routed.immediate is not None:
            return routed
        parts = []
        while True:
            a = await self.answer()
            if self._immediate(a, routed):
                return routed
            streamed = a.request_body.response.body_mutation.streamed_response
            parts.append(streamed.body)
            self._metadata(a, routed)
            if streamed.end_of_stream:
                break
        routed.body = b"".join(parts)
        return routed

    async def _headers_answer(self, routed: Routed) -> Routed:
        a = await self.answer()
        if self._immediate(a, routed):
            return routed
        assert a.WhichOneof("response") == "request_headers", a
        _apply(routed.headers, a.request_headers.response.header_mutation)
        self._metadata(a, routed)
        self._override(a, routed)
        return routed

    def _override(self, a: ep.ProcessingResponse, routed: Routed) -> None:
        if not a.HasField("mode_override") or not self.config.allow_mode_override:
            return
        if FULL_DUPLEX in (self.config.request_body_mode, self.config.response_body_mode):
            return
        routed.mode_overrides.append(a.mode_override)

    @staticmethod
    def _immediate(a: ep.ProcessingResponse, routed: Routed) -> bool:
        if a.WhichOneof("response") == "immediate_response":
            routed.immediate = a.immediate_response
            return True
        return False

    @staticmethod
    def _metadata(a: ep.ProcessingResponse, routed: Routed) -> None:
        if a.HasField("dynamic_metadata"):
            routed.metadata.update(_struct(a.dynamic_metadata))

    async def respond_headers(
        self, status: int, headers: Mapping[str, str], served: str | None, *, has_body: bool
    ) -> None:
        """The upstream's response headers, with the endpoint that served in ``envoy.lb``."""
        if self.config.response_header_mode == Mode.SKIP:
            return
        h = {":status": str(status), **{k.lower(): v for k, v in headers.items()}}
        kwargs: dict[str, Any] = {
            "response_headers": ep.HttpHeaders(headers=header_map(h), end_of_stream=not has_body)
        }
        if served is not None:
            kwargs["metadata_context"] = metadata(msg.LB_NAMESPACE, msg.SERVED, served)
        await self.send(self._message(**kwargs))
        a = await self.answer()
        assert a.WhichOneof("response") == "response_headers", a

    async def respond_chunk(self, chunk: bytes, last: bool) -> bytes:
        """One response body chunk; the bytes Envoy sends the client for it."""
        mode = self.config.response_body_mode
        if mode == Mode.NONE:
            return chunk
        await self.send(self._message(response_body=ep.HttpBody(body=chunk, end_of_stream=last)))
        a = await self.answer()
        assert a.WhichOneof("response") == "response_body", a
        if mode == FULL_DUPLEX:
            streamed = a.response_body.response.body_mutation.streamed_response
            return bytes(streamed.body)
        return chunk

    async def respond_trailers(self) -> None:
        if self.config.response_trailer_mode != Mode.SEND:
            return
        await self.send(self._message(response_trailers=ep.HttpTrailers()))
        a = await self.answer()
        assert a.WhichOneof("response") == "response_trailers", a

    async def respond(
        self,
        status: int,
        body_chunks: Sequence[bytes],
        *,
        served: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """A whole response phase, then the filter closes its side; the client's bytes."""
        await self.respond_headers(status, headers or {}, served, has_body=bool(body_chunks))
        out = []
        if self.config.response_body_mode == BUFFERED and body_chunks:
            out.append(await self.respond_chunk(b"".join(body_chunks), True))
        else:
            for i, chunk in enumerate(body_chunks):
                out.append(await self.respond_chunk(chunk, i == len(body_chunks) - 1))
        await self.respond_trailers()
        await self.close()
        return b"".join(out)

    async def close(self) -> None:
        """Processing is over: the filter half-closes, and the picker ends the RPC."""
        await self.call.done_writing()
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await self.call.read() is not grpc.aio.EOF:
                pass

    def reset(self) -> None:
        """The HTTP request was destroyed mid-way: the gRPC stream is reset."""
        self.call.cancel()


@contextlib.asynccontextmanager
async def channel_to(address: str) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to the picker at ``address`` (``host:port``), closed at the end."""
    ch = grpc.aio.insecure_channel(address)
    try:
        yield ch
    finally:
        await ch.close()
