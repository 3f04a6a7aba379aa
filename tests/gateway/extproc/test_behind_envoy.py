"""The picker as it runs behind an Envoy-based gateway: ``kvrouter serve --epp-port P
--no-proxy`` from the installed console script, real ``engine-sim`` processes, the Python
stand-in for Envoy's data plane (tests.gateway.extproc.data_plane) forwarding where the
picker says, and the official ``openai`` client talking to the stand-in."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.extproc.data_plane import DataPlane
from tests.gateway.extproc.envoy_standin import BUFFERED, FilterConfig, channel_to
from tests.gateway.integration import MODEL
from tests.support import (
    CHECKOUT_KVROUTER,
    LOOPBACK,
    Proc,
    eventually,
    free_port,
    http_json,
    metric,
    metrics_text,
    readiness,
    running,
    start_kvrouter,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

SYSTEM = " ".join(f"rule{i} answer briefly and precisely" for i in range(60))
CONFIG = """
health: {interval_seconds: 0.5, timeout_seconds: 2}
limits: {max_body_bytes: 65536, max_attempts: 2}
"""
# The console script pip installed, as a user runs it.
INSTALLED = shutil.which("kvrouter", path=str(Path(sys.executable).parent))


@dataclass
class Pool:
    engines: list[Proc]
    picker: Proc
    epp: str  # the picker's gRPC address

    def endpoint(self, engine: Proc) -> str:
        return engine.url.removeprefix("http://")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    tmp = tmp_path_factory.mktemp("epp")
    with running([]) as procs:
        engines = [start_kvrouter(["engine-sim", "--fast"], tmp) for _ in range(2)]
        procs.extend(engines)
        config = tmp / "serve.yaml"
        config.write_text(CONFIG)
        epp_port = free_port()
        args = ["serve", "--config", str(config), "--host", LOOPBACK, "--epp-port", str(epp_port)]
        args.append("--no-proxy")
        for e in engines:
            args += ["--engine", e.url]
        command = (INSTALLED,) if INSTALLED else CHECKOUT_KVROUTER
        picker = start_kvrouter(args, tmp, command=command)
        procs.append(picker)
        wait_until(lambda: readiness(picker)["healthy_backends"] == 2, "both engines healthy")
        yield Pool(engines, picker, f"{LOOPBACK}:{epp_port}")
        assert picker.stop() == 0
        assert "Traceback" not in picker.log()


def client(dp: DataPlane) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{dp.url}/v1", api_key="k", max_retries=0, timeout=20)


def chat(user: str, stream: bool = False) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "stream": stream,
    }


def assert_inflight_zero(picker: Proc) -> None:
    def zero() -> bool:
        fams = text_string_to_metric_families(metrics_text(picker))
        samples = [
            s for f in fams if f.name.startswith("kvrouter_backend_inflight") for s in f.samples
        ]
        return bool(samples) and all(s.value == 0 for s in samples)

    wait_until(zero, "in-flight gauges back to zero")


@pytest.mark.parametrize(
    "config", [FilterConfig(), FilterConfig(BUFFERED, BUFFERED)], ids=["full-duplex", "buffered"]
)
async def test_openai_client_through_envoy_standin(pool: Pool, config: FilterConfig) -> None:
    async with DataPlane(pool.epp, config).running() as dp, client(dp) as c:
        full = await c.chat.completions.create(**chat("hello there"))  # type: ignore[call-overload]
        assert full.choices[0].message.content
        stream = await c.chat.completions.create(  # type: ignore[call-overload]
            **chat("hello again", stream=True), stream_options={"include_usage": True}
        )
        chunks = [ch async for ch in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text.split()
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
        # The same long prefix goes where it went before, and that engine's cache serves it.
        again = await c.chat.completions.create(**chat("hello there, once more"))  # type: ignore[call-overload]
        assert dp.served[2] == dp.served[0]
        details = again.usage.prompt_tokens_details if again.usage else None
        assert details is not None and (details.cached_tokens or 0) > 0
        with pytest.raises(openai.NotFoundError) as nf:
            await c.chat.completions.create(**{**chat("x"), "model": "no-such-model"})  # type: ignore[call-overload]
        assert nf.value.code == "model_not_found"
    assert_inflight_zero(pool.picker)
    assert metric(pool.picker, "kvrouter_epp_picks_total", served="pick") >= 3


def test_no_proxy_leaves_health_metrics_and_admin_only(pool: Pool) -> None:
    url = pool.picker.url
    assert status_of(f"{url}/health") == 200 and status_of(f"{url}/ready") == 200
    assert status_of(f"{url}/v1/models") == 404
    with pytest.raises(Exception, match="404"):
        http_json(f"{url}/v1/chat/completions", chat("hi"))
    assert "kvrouter_epp_decisions_total" in metrics_text(pool.picker)


async def test_grpc_health_on_the_picker_port(pool: Pool) -> None:
    async with channel_to(pool.epp) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):

            async def serving(service: str = service) -> bool:
                # Readiness follows /ready on the picker's own poll: the first may come late.
                got = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                return bool(got.status == health_pb2.HealthCheckResponse.SERVING)

            assert await eventually(serving, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Check(health_pb2.HealthCheckRequest(service="nonesuch"), timeout=5)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
