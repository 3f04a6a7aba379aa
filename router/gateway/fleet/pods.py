"""Engines from the Kubernetes API: the Ready pods a label selector picks, listed then watched.

What an InferencePool's selector names, found as its controller finds it: list the pods,
then watch them; each change sets the pool's ``pods`` engines (``EnginePool.set_addresses``)
to ``scheme://POD_IP:port`` for every pod that is Ready, has an IP and is not being deleted.
A watch that fails or ends starts over from a fresh list after a pause; while the API cannot
be reached the last engines found stay. Credentials are the pod's service account when run in
a cluster, else the kubeconfig (``lightkube.KubeConfig.from_env``).

The client is lightkube (an optional extra, ``kvrouter[kubernetes]``): asynchronous, typed
models, and small next to the generated kubernetes clients, for the two calls made here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from router.core.fields import ConfigError
from router.gateway.config.pods import PodEngines
from router.gateway.fleet.pool import url_for

log = logging.getLogger(__name__)

SOURCE = "pods"
RETRY_SECONDS = 2.0
# Where a pod's service account names its namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _lightkube() -> Any:
    try:
        import lightkube  # an optional extra: only pod discovery needs it
    except ImportError:
        raise ConfigError(
            "engines.pods (--engine-pods) needs the Kubernetes client: "
            "pip install 'kvrouter[kubernetes]'"
        ) from None
    return lightkube


def own_namespace(path: Path = NAMESPACE_FILE) -> str:
    """The namespace of the pod this runs in, else ``default``."""
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"


def engine_of(pod: Any, pods: PodEngines) -> str | None:
    """The engine URL of a pod that can serve, else None."""
    status, meta = pod.status, pod.metadata
    if status is None or not status.podIP or (meta and meta.deletionTimestamp):
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    return url_for(pods.scheme, status.podIP, pods.port) if ready else None


class PodWatcher:
    """Keeps the pool's ``pods`` engines equal to the selector's Ready pods."""

    def __init__(
        self,
        pods: PodEngines,
        set_addresses: Callable[[str, Iterable[str]], None],
        client: Callable[[], Any] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.pods = pods
        self.namespace = pods.namespace or own_namespace()
        self._set = set_addresses
        lk = _lightkube()  # raises ConfigError at start, not later in a loop
        self._client = client or (lambda: lk.AsyncClient(namespace=self.namespace))
        self._retry = retry_seconds
        self._found: dict[str, str] = {}  # pod name -> engine URL

    def _publish(self) -> None:
        self._set(SOURCE, sorted(set(self._found.values())))

    def _apply(self, name: str, engine: str | None) -> bool:
        """One pod's state; True when the engines changed."""
        before = self._found.get(name)
        if engine is None:
            self._found.pop(name, None)
        else:
            self._found[name] = engine
        return before != engine

    async def sync_once(self, client: Any) -> None:
        """List, then watch until the watch ends (raises what the API raises)."""
        from lightkube.resources.core_v1 import Pod  # the optional extra, checked at start

        labels: Mapping[str, str] = self.pods.labels()
        found: dict[str, str] = {}
        async for pod in client.list(Pod, namespace=self.namespace, labels=labels):
            engine = engine_of(pod, self.pods)
            if engine is not None:
                found[pod.metadata.name] = engine
        self._found = found
        self._publish()
        log.info("pods %s in %s: %d engine(s)", self.pods.selector, self.namespace, len(found))
        async for op, pod in client.watch(Pod, namespace=self.namespace, labels=labels):
            gone = op == "DELETED"
            engine = None if gone else engine_of(pod, self.pods)
            if self._apply(pod.metadata.name, engine):
                self._publish()

    async def run(self) -> None:
        """Follow the pods forever; a failed list or watch starts over after a pause."""
        client = self._client()
        try:
            while True:
                try:
                    await self.sync_once(client)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning(
                        "pod discovery (%s in %s) failed: %s; keeping %d engine(s)",
                        self.pods.selector, self.namespace, e, len(self._found),
                    )  # fmt: skip
                await asyncio.sleep(self._retry)
        finally:
            await client.close()
