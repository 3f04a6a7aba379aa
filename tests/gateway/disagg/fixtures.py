"""The peers' proxies' requests, one file per (protocol, route, stream): tests/fixtures/pd.

Each file holds what a client sent, what the proxy then sent its prefill and decode engines
(and, for vLLM, what the prefill engine answered), with the values that vary per request
written as ``PLACEHOLDERS``. ``same`` compares two JSON values with their keys' order, as the
proxies serialise them; ``placed`` writes a value of ours in a fixture's placeholder form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pd"
REQUEST_ID, ROOM, HOST = "<request-id>", "<room>", "<host>"
PLACEHOLDERS = (REQUEST_ID, ROOM, HOST)


def load_all() -> list[tuple[str, dict[str, Any]]]:
    """(name, fixture) of every fixture present, in name order."""
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        out.append((path.stem, json.loads(path.read_text())))
    return out


def same(a: Any, b: Any) -> bool:
    """Equal values with the same key order everywhere (what the wire carries)."""
    return orjson.dumps(a) == orjson.dumps(b)


def placed(body: dict[str, Any], fixture_body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with the values the fixture writes as placeholders replaced by them."""
    out = dict(body)
    for key, value in fixture_body.items():
        if value in PLACEHOLDERS and key in out:
            out[key] = value
    return out
