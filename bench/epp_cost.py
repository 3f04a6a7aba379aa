"""The endpoint picker's cost: from the request's last body message to its answer, against the
proxy's decision time for the same requests.

Two gateways over the same engines (addresses only, nothing is sent), fed the same Mooncake
records in the same order, one request at a time and alternately, so that both cores hold the
same index at every step and both are timed in the same stretch of time:

- proxy: ``decide`` (router.gateway.exchange), what ``kvrouter_routing_decision_seconds``
  times, on a body parsed beforehand; and parse + admission + ``decide`` + ``acquire``, the
  proxy's steps from a body to its first byte to the engine;
- picker: ``PickerStream.on`` for the body message ending the request, in full-duplex streamed
  mode, up to the answer naming the pick (parse, admission, the same ``decide``, the lease,
  the header mutation and metadata), what ``kvrouter_epp_answer_seconds`` times; the body's
  copies handed back after it are not counted.

Both then record the prefix on the engine picked and release, as a 200 would. Times are wall
clock of the one thread (no I/O is involved).

    python -m bench.epp_cost [--trace ../shared/data/conversation_trace.jsonl]
        [--requests 2000] [--engines 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path

import orjson

from bench.common import markdown_table, print_report
from router.core.stats import percentile
from router.core.workload import from_mooncake
from router.gateway.config.engines import EngineSources
from router.gateway.config.settings import Config
from router.gateway.exchange import decide
from router.gateway.extproc.endpoints import Endpoints
from router.gateway.extproc.messages import FULL_DUPLEX_STREAMED
from router.gateway.extproc.metrics import EppMetrics
from router.gateway.extproc.pb import envoy_service_ext_proc_v3_external_processor_pb2 as ep
from router.gateway.extproc.stream import Picker, PickerStream
from router.gateway.openai.request import parse
from router.gateway.wiring import Gateway
from router.presets import preset_path

MODEL = "sim-model"
ROUTE = "/v1/completions"


class Null:
    """An upstream nobody calls: the gateways here only decide."""

    async def send(self, request: object) -> object:
        raise AssertionError("nothing is sent")

    async def fetch(self, *args: object, **kw: object) -> tuple[int, bytes]:
        raise AssertionError("nothing is fetched")

    async def close(self) -> None:
        pass


def gateway(engines: list[str]) -> Gateway:
    cfg = Config(engines=EngineSources(static=tuple(engines)))
    gw = Gateway(cfg, preset_path("kv-aware"), upstream=Null(), environ={})  # type: ignore[arg-type]
    for url in engines:
        gw.pool.set_models(url, {MODEL: {"id": MODEL}})
        for _ in range(gw.config.health.eject_after_failures + 1):
            gw.pool.report_success(url, probe=True)
    return gw


def bodies(path: Path, n: int) -> list[bytes]:
    out = []
    with path.open() as f:
        for i, line in enumerate(itertools.islice(f, n)):
            body = dict(from_mooncake(json.loads(line), f"{path}:{i + 1}").request_body())
            body["model"] = MODEL
            out.append(orjson.dumps(body))
    return out


def messages(raw: bytes) -> tuple[ep.ProcessingRequest, ep.ProcessingRequest]:
    head = ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(
            headers={"headers": [{"key": ":path", "raw_value": ROUTE.encode()}]}
        )
    )
    head.protocol_config.request_body_mode = FULL_DUPLEX_STREAMED
    head.protocol_config.response_body_mode = FULL_DUPLEX_STREAMED
    return head, ep.ProcessingRequest(request_body=ep.HttpBody(body=raw, end_of_stream=True))


RESPONSE = ep.ProcessingRequest(
    response_headers=ep.HttpHeaders(
        headers={"headers": [{"key": ":status", "raw_value": b"200"}]}, end_of_stream=True
    )
)


async def run(raws: list[bytes], engines: list[str]) -> dict[str, list[float]]:
    proxy, picking = gateway(engines), gateway(engines)
    s = picking.services
    picker = Picker(
        s, Endpoints(lambda: picking.pool.engines), EppMetrics(picking.metrics.registry)
    )
    times: dict[str, list[float]] = {"decide": [], "parse+admit+decide+acquire": [], "picker": []}
    for raw in raws:
        t0 = time.perf_counter()
        inbound = parse(raw, ROUTE)
        await proxy.admission.enter(proxy.pool.candidates(MODEL), 0, "-")
        t1 = time.perf_counter()
        d = decide(proxy.services, inbound, {})
        t2 = time.perf_counter()
        assert d.engine is not None
        lease = proxy.core.acquire(d, d.engine, proxy.clock())
        t3 = time.perf_counter()
        proxy.core.record(lease, proxy.clock())
        proxy.core.release(lease)
        proxy.admission.leave()
        times["decide"].append(t2 - t1)
        times["parse+admit+decide+acquire"].append(t3 - t0)

        stream = PickerStream(picker)
        head, body = messages(raw)
        await stream.on(head)
        t4 = time.perf_counter()
        answers = iter(await stream.on(body))
        pick = next(answers)  # the answer naming the pick; the body's copies follow it
        t5 = time.perf_counter()
        assert pick.HasField("request_headers") and stream.lease is not None
        assert stream.lease.engine == d.engine
        for _ in answers:
            pass
        await stream.on(RESPONSE)
        stream.close()
        times["picker"].append(t5 - t4)
    assert proxy.core.outstanding == picking.core.outstanding == 0
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="../shared/data/conversation_trace.jsonl")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    raws = bodies(Path(args.trace), args.requests)
    engines = [f"http://10.0.0.{i + 1}:8000" for i in range(args.engines)]
    times = asyncio.run(run(raws, engines))
    base = percentile(times["decide"], 50)
    like = percentile(times["parse+admit+decide+acquire"], 50)
    rows = []
    for name, ts in times.items():
        p50, p99 = percentile(ts, 50), percentile(ts, 99)
        rows.append(
            [name, f"{p50 * 1e6:.0f}", f"{p99 * 1e6:.0f}", f"{p50 / base:.2f}", f"{p50 / like:.2f}"]
        )
    title = (
        f"{args.requests} requests of {Path(args.trace).name}, {args.engines} engines, "
        "one at a time, proxy and picker alternately"
    )
    head = ["path", "p50 us", "p99 us", "p50 / decide", "p50 / proxy's steps"]
    table = markdown_table(head, rows)
    records = [
        {"path": k, "p50": percentile(v, 50), "p99": percentile(v, 99)} for k, v in times.items()
    ]
    print_report(title, table, records if args.json else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
