"""Client API keys: parsing, constant-time lookup, the 401, and the key's name as tenant."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from router.core.fields import ConfigError
from router.gateway.config.serving import Auth
from router.gateway.inbound.auth import load_keys, parse_keys
from tests.gateway.rig import CHAT, chat, rig

DIGEST = hashlib.sha256(b"sk-hashed").hexdigest()


def test_parse_keys_plain_and_hashed_entries_by_line_or_comma() -> None:
    keys = parse_keys(f"team-a=sk-a, team-b=sk-b\n# a comment\nops=sha256:{DIGEST}\n", "k")
    assert sorted(keys.values()) == ["ops", "team-a", "team-b"]
    assert b"sk-a" not in b"".join(keys)  # only digests are kept


@pytest.mark.parametrize(
    "text",
    ["no-equals-sign", "=sk-x", "name=", "n=sha256:abc", "n=sha256:" + "zz" * 32],
    ids=["no-sep", "no-name", "no-key", "short-digest", "not-hex"],
)
def test_parse_keys_bad_entry_names_it(text: str) -> None:
    with pytest.raises(ConfigError, match="where"):
        parse_keys(text, "where")


def test_load_keys_file_and_environment(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("a=sk-1\n")
    keys = load_keys(str(f), "KEYS", {"KEYS": "b=sk-2"})
    assert keys.name_of("sk-1") == "a" and keys.name_of("sk-2") == "b"
    assert keys.name_of("sk-3") is None and keys.enabled
    assert not load_keys("", "KEYS", {}).enabled
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(str(tmp_path / "missing"), "KEYS", {})


async def test_gateway_with_keys_401_without_a_known_key(tmp_path: Path) -> None:
    env = {"KVROUTER_API_KEYS": f"team-a=sk-a,ops=sha256:{DIGEST}"}
    async with rig(tmp_path, env=env, auth=Auth()) as r:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-a"}):
            status, body = await r.post(CHAT, chat(), headers=headers)
            assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert r.up.sent == []  # nothing reached an engine
        for key in ("sk-a", "sk-hashed"):
            status, _ = await r.post(CHAT, chat(), headers={"Authorization": f"Bearer {key}"})
            assert status == 200
        assert (await r.client.get("/v1/models")).status == 401
        assert (await r.client.get("/health")).status == 200  # probes stay open
        assert (await r.client.get("/metrics")).status == 200


async def test_gateway_without_keys_is_open(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        assert (await r.post(CHAT, chat()))[0] == 200
