"""A fake Kubernetes API server (aiohttp) for pod discovery: list and watch of pods.

``GET /api/v1/namespaces/NS/pods`` answers a PodList of the pods whose labels match the
``labelSelector``; with ``watch=true`` it streams watch events (one JSON object per line, as
the API server does) pushed by the test with ``event``, until the test ends the watch (a
client resumes a watch that ends cleanly; one answered 410 Gone makes it list again).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from router.hostport import LOOPBACK, free_port


def pod(
    name: str, ip: str, *, ready: bool = True, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "models", "labels": labels or {"app": "vllm"}},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _status(code: int, reason: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
    }


class FakeKube:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.pods: dict[str, dict[str, Any]] = {}
        self.selectors: list[str] = []  # every labelSelector asked
        self.lists = 0
        self.watches = 0
        self.fail_lists = 0  # answer this many lists with a 500
        self.fail_watches = 0  # answer this many watches with a 410 Gone
        self._events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def _matches(self, p: dict[str, Any], selector: str) -> bool:
        labels = p["metadata"].get("labels", {})
        for part in filter(None, selector.split(",")):
            k, _, v = part.partition("=")
            if labels.get(k) != v:
                return False
        return True

    def event(self, kind: str, p: dict[str, Any]) -> None:
        """Change a pod and tell the watcher (ADDED, MODIFIED, DELETED)."""
        if kind == "DELETED":
            self.pods.pop(p["metadata"]["name"], None)
        else:
            self.pods[p["metadata"]["name"]] = p
        self._events.put_nowait({"type": kind, "object": p})

    def end_watch(self) -> None:
        self._events.put_nowait(None)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        self.selectors.append(selector)
        if request.query.get("watch") in ("true", "1"):
            self.watches += 1
            if self.fail_watches:
                self.fail_watches -= 1
                return web.json_response(_status(410, "Expired"), status=410)
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            while (ev := await self._events.get()) is not None:
                if self._matches(ev["object"], selector):
                    await resp.write(json.dumps(ev).encode() + b"\n")
            return resp
        self.lists += 1
        if self.fail_lists:
            self.fail_lists -= 1
            return web.json_response(_status(500, "InternalError"), status=500)
        items = [p for p in self.pods.values() if self._matches(p, selector)]
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}
        return web.json_response({**body, "items": items})

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeKube]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, self.port).start()
        try:
            yield self
        finally:
            self.end_watch()
            await runner.cleanup()
