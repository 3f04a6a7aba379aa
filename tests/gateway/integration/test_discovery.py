"""Backend discovery through a real DNS lookup: ``--backend-dns NAME:PORT``.

The unit tests drive appearing and disappearing engines with a scripted resolver; this one
checks the real path: the gateway resolves ``localhost`` itself, probes every address it gets
(127.0.0.1 answers; ::1, where the system returns it, has nobody listening and stays out),
and serves through the engine it found.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support import Proc, readiness, start_kvrouter, wait_until

pytestmark = pytest.mark.integration

CONFIG = """
backends:
  dns: {{name: localhost, port: {port}, scheme: http, interval_seconds: 0.5}}
health: {{interval_seconds: 0.5, timeout_seconds: 2, eject_after_failures: 2,
         readmit_backoff_seconds: 1, readmit_backoff_max_seconds: 2}}
"""


def test_dns_name_resolves_to_engine_and_serves(tmp_path: Path, procs: list[Proc]) -> None:
    engine = start_kvrouter(["engine-sim", "--fast", "--host", "127.0.0.1"], tmp_path)
    procs.append(engine)
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG.format(port=engine.port))
    router = start_kvrouter(["serve", "--config", str(config), "--host", "127.0.0.1"], tmp_path)
    procs.append(router)
    wait_until(lambda: readiness(router)["healthy_backends"] >= 1, "the discovered engine")

    body = {"model": "sim-model", "prompt": "hello there", "max_tokens": 2}
    req = urllib.request.Request(
        f"{router.url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["object"] == "text_completion"
    with urllib.request.urlopen(f"{engine.url}/stats", timeout=10) as r:
        assert json.loads(r.read())["requests"] == 1
