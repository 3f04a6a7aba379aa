"""The picker's gRPC server: Envoy's ExternalProcessor and gRPC health on one port.

``PickerServer`` owns the server and its two background loops (the endpoints' name
resolution, and readiness), started by ``start`` and stopped by ``stop``. Health answers
``liveness`` (always SERVING while the process serves), and ``readiness``, the empty service
name and the ExternalProcessor's own name: SERVING exactly when the gateway's ``/ready``
says ready (a policy loaded, an engine healthy, not stopping), as the proposal's health
section asks.

A stream Envoy resets, or closes before the response's end, ends the requests' iterator; a
message that does not decode, or a body mode the picker cannot pick in, ends the stream with
a gRPC status. None leaves load behind (``PickerStream.close`` runs on every exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from router import hostport
from router.gateway.extproc.endpoints import Endpoints
from router.gateway.extproc.metrics import EppMetrics
from router.gateway.extproc.pb import envoy_service_ext_proc_v3_external_processor_pb2 as ep
from router.gateway.extproc.pb import (
    envoy_service_ext_proc_v3_external_processor_pb2_grpc as ep_grpc,
)
from router.gateway.extproc.stream import Picker, PickerStream, Unsupported
from router.gateway.wiring import Services

log = logging.getLogger(__name__)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = ("", "readiness", SERVICE)
READY_POLL_SECONDS = 0.25
# Envoy's own default for an ext_proc message is 4 MiB; bodies are bounded by the limits.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """``Process``: one stream per HTTP request, one ``PickerStream`` per stream."""

    def __init__(self, picker: Picker) -> None:
        self.picker = picker

    async def Process(  # the gRPC method's name
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[ep.ProcessingResponse]:
        stream = PickerStream(self.picker)
        try:
            with self.picker.s.drain.exchange():
                async for req in request_iterator:
                    for answer in await stream.on(req):
                        yield answer
        except Unsupported as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Exception:
            log.exception("epp: unexpected error on %s", stream.route or "a stream")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error in the picker")
        finally:
            # A reset and a close both end the requests' iterator here (grpc cancels the
            # handler only a moment later): a stream over before its response is one reset.
            stream.close()


class PickerServer:
    """The gRPC listener of the endpoint picker, with health; ``start`` then ``stop``."""

    def __init__(
        self,
        s: Services,
        host: str,
        port: int,
        ready: Callable[[], tuple[bool, str]],
        *,
        endpoints: Endpoints | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.endpoints = endpoints or Endpoints(lambda: s.pool.engines)
        self.metrics = EppMetrics(s.metrics.registry)
        self.picker = Picker(s, self.endpoints, self.metrics)
        self.bind = hostport.join(host, port)
        self._ready = ready
        self._reuse_port = reuse_port
        self.health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._serving: bool | None = None
        self.port = port

    async def start(self) -> None:
        """Listen and serve; raises ``OSError`` when the port cannot be had."""
        options = [
            ("grpc.so_reuseport", 1 if self._reuse_port else 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        server = grpc.aio.server(options=options)
        ep_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.picker), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            port = server.add_insecure_port(self.bind)
        except RuntimeError as e:  # newer grpcio raise instead of returning port 0
            raise OSError(f"the picker cannot listen on {self.bind}: {e}") from None
        if port == 0:
            raise OSError(f"the picker cannot listen on {self.bind}")
        self.port = port
        await self.endpoints.refresh()
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self._readiness()
        await server.start()
        self._server = server
        self._tasks = [
            asyncio.create_task(self.endpoints.run(), name="epp-endpoints"),
            asyncio.create_task(self._readiness_loop(), name="epp-readiness"),
        ]
        log.info("endpoint picker listening on %s (gRPC ext_proc and health)", self.bind)

    async def _readiness(self) -> None:
        ok, _ = self._ready()
        if ok == self._serving:
            return
        self._serving = ok
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ok
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in READINESS:
            await self.health.set(name, status)

    async def _readiness_loop(self) -> None:
        while True:
            await asyncio.sleep(READY_POLL_SECONDS)
            try:
                await self._readiness()
            except Exception:
                log.exception("epp: readiness update failed")

    async def stop(self, grace: float = 1.0) -> None:
        """Refuse new streams, give open ones ``grace`` seconds, then cancel them."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace)
            self._server = None
