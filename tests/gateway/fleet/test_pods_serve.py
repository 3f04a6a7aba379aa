"""``kvrouter serve --engine-pods SELECTOR`` as a real process against the fake Kubernetes API
server: the Ready pod the selector picks becomes a healthy engine, and leaves when deleted."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from tests.gateway.fleet.fake_kube import FakeKube, pod
from tests.support import LOOPBACK, eventually, readiness, running, start_kvrouter

pytestmark = pytest.mark.integration


def kubeconfig(tmp: Path, server: str) -> Path:
    path = tmp / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "fake", "user": "tester"}}],
        "current-context": "t",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def test_serve_follows_the_pods_the_selector_picks(tmp_path: Path) -> None:
    # Outside any cluster whatever runs the tests: the kubeconfig names the fake server.
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    async with FakeKube().running() as kube:
        with running([]) as procs:
            engine = await asyncio.to_thread(start_kvrouter, ["engine-sim", "--fast"], tmp_path)
            procs.append(engine)
            kube.pods = {
                "vllm-0": pod("vllm-0", LOOPBACK, labels={"app": "vllm"}),
                "other": pod("other", "127.0.0.9", labels={"app": "other"}),
            }
            env = {"KUBECONFIG": str(kubeconfig(tmp_path, kube.url))}
            args = ["serve", "--host", LOOPBACK, "--engine-pods", "app=vllm"]
            args += ["--engine-pods-port", str(engine.port)]
            router = await asyncio.to_thread(start_kvrouter, args, tmp_path, env=env, base_env=base)
            procs.append(router)

            async def healthy() -> int:
                return int((await asyncio.to_thread(readiness, router))["healthy_backends"])

            await eventually(lambda: healthy(), timeout=20)
            assert set(kube.selectors) == {"app=vllm"}
            await eventually(lambda: kube.watches >= 1, timeout=10)
            kube.event("DELETED", kube.pods["vllm-0"])

            async def gone() -> bool:
                return int((await asyncio.to_thread(readiness, router))["backends"]) == 0

            await eventually(gone, timeout=20)
            assert router.stop() == 0
            assert "Traceback" not in router.log()
