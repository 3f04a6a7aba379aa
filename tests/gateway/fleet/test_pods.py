"""Pod discovery against a fake Kubernetes API server: list, then watch; Ready pods with an
IP are engines, others are not; a failed list is retried and the last engines stay."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest
from lightkube import AsyncClient, KubeConfig

from router.core.fields import ConfigError
from router.gateway.config.engines import EngineSources
from router.gateway.config.pods import PodEngines, labels_of, with_pods
from router.gateway.config.settings import HealthSettings
from router.gateway.fleet.pods import PodWatcher, own_namespace
from router.gateway.fleet.pool import EnginePool
from tests.fakes import FakeUpstream
from tests.gateway.fleet.fake_kube import FakeKube, pod
from tests.support import eventually

SELECTOR = "app=vllm,tier=gpu"
GPU = {"app": "vllm", "tier": "gpu"}


class Found:
    def __init__(self) -> None:
        self.sets: list[tuple[str, list[str]]] = []

    def __call__(self, source: str, urls: Iterable[str]) -> None:
        self.sets.append((source, list(urls)))

    @property
    def now(self) -> list[str]:
        return self.sets[-1][1] if self.sets else []


def watcher(kube: FakeKube, found: Found) -> PodWatcher:
    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "t",
                    "context": {"cluster": "fake", "user": "tester", "namespace": "models"},
                }
            ],
            "current-context": "t",
        }
    )
    pods = PodEngines(SELECTOR, namespace="models", port=8000)
    return PodWatcher(pods, found, client=lambda: AsyncClient(config), retry_seconds=0.05)


async def test_pods_listed_then_watched(tmp_path: Path) -> None:
    async with FakeKube().running() as kube:
        kube.pods = {
            "a": pod("a", "10.1.0.1", labels=GPU),
            "b": pod("b", "10.1.0.2", labels=GPU, ready=False),
            "c": pod("c", "10.1.0.3", labels={"app": "other"}),
        }
        found = Found()
        w = watcher(kube, found)
        task = asyncio.create_task(w.run())
        try:
            await eventually(lambda: found.now == ["http://10.1.0.1:8000"], timeout=5)
            assert found.sets[0][0] == "pods"
            assert set(kube.selectors) == {SELECTOR}
            await eventually(lambda: kube.watches == 1, timeout=5)
            kube.event("MODIFIED", pod("b", "10.1.0.2", labels=GPU))  # b turned Ready
            await eventually(
                lambda: found.now == ["http://10.1.0.1:8000", "http://10.1.0.2:8000"], timeout=5
            )
            kube.event("DELETED", pod("a", "10.1.0.1", labels=GPU))
            await eventually(lambda: found.now == ["http://10.1.0.2:8000"], timeout=5)
            kube.event("ADDED", pod("d", "", labels=GPU))  # no IP yet: no engine
            kube.event("MODIFIED", pod("b", "10.1.0.2", labels=GPU, ready=False))
            await eventually(lambda: found.now == [], timeout=5)
            # The watch ends (the API server's timeout): the client watches on.
            kube.end_watch()
            await eventually(lambda: kube.watches == 2, timeout=5)
            kube.event("ADDED", pod("e", "10.1.0.5", labels=GPU))
            await eventually(lambda: found.now == ["http://10.1.0.5:8000"], timeout=5)
            assert kube.lists == 1
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_pods_failed_list_keeps_the_last_engines_and_retries(tmp_path: Path) -> None:
    async with FakeKube().running() as kube:
        kube.pods = {"a": pod("a", "10.1.0.1", labels=GPU)}
        found = Found()
        task = asyncio.create_task(watcher(kube, found).run())
        try:
            await eventually(lambda: found.now == ["http://10.1.0.1:8000"], timeout=5)
            await eventually(lambda: kube.watches == 1, timeout=5)
            # The watch's history is gone (410): a fresh list, which fails twice first.
            kube.fail_watches, kube.fail_lists = 1, 2
            kube.end_watch()
            await eventually(lambda: kube.lists >= 4 and kube.watches >= 3, timeout=5)
            assert all(urls == ["http://10.1.0.1:8000"] for _, urls in found.sets)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.mark.parametrize(
    ("selector", "labels"),
    [
        ("app=vllm", {"app": "vllm"}),
        (
            "app.kubernetes.io/name=vllm, tier = gpu",
            {"app.kubernetes.io/name": "vllm", "tier": "gpu"},
        ),
        ("app==vllm", {"app": "vllm"}),
    ],
)
def test_pods_selector_parses(selector: str, labels: dict[str, str]) -> None:
    assert labels_of(selector) == labels


@pytest.mark.parametrize("selector", ["app", "app!=vllm", "app in (a,b)", "=x", "a=b,,"])
def test_pods_selector_refused_with_a_reason(selector: str) -> None:
    with pytest.raises(ValueError, match="key=value"):
        labels_of(selector)
    with pytest.raises(ConfigError, match="--engine-pods"):
        with_pods(None, selector, None)


def test_pods_flags_apply_over_the_file() -> None:
    got = with_pods(PodEngines("app=a", namespace="ns", port=9000), "app=b", None)
    assert got == PodEngines("app=b", namespace="ns", port=9000)
    assert with_pods(None, "app=c", 8080) == PodEngines("app=c", port=8080)
    assert with_pods(None, None, 8080) is None


def test_pods_namespace_is_the_service_accounts(tmp_path: Path) -> None:
    f = tmp_path / "namespace"
    f.write_text("models\n")
    assert own_namespace(f) == "models"
    assert own_namespace(tmp_path / "missing") == "default"


def test_pool_discovery_sources_replace_only_their_own_engines() -> None:
    pool = EnginePool(
        EngineSources(static=("http://static:8000",)),
        HealthSettings(),
        FakeUpstream(),
        lambda weights: None,
    )
    pool.set_addresses("pods", ["http://10.1.0.1:8000"])
    pool.set_addresses("dns:engines", ["http://10.2.0.1:8000"])
    sources = {url: e.source for url, e in pool.engines.items()}
    assert sources == {
        "http://static:8000": "static",
        "http://10.1.0.1:8000": "pods",
        "http://10.2.0.1:8000": "dns:engines",
    }
    pool.set_addresses("pods", [])
    assert set(pool.engines) == {"http://static:8000", "http://10.2.0.1:8000"}
