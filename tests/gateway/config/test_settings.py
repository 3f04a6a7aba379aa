"""The serve config file: the chart's exact shape, strict errors with field paths, flags."""

from __future__ import annotations

import argparse
import dataclasses
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import router.gateway.config.settings
from router.cli import main
from router.commands import serve
from router.core.fields import MAX_YAML_BYTES, ConfigError
from router.gateway.config.engines import DnsEngines, engine_url
from router.gateway.config.overrides import with_kv_events, with_overrides
from router.gateway.config.settings import (
    Config,
    check_ready_to_serve,
    load_config,
    load_config_text,
    parse_config,
)

CHART_SHAPE = """
listen: {host: 0.0.0.0, port: 8000}
policy: /etc/kvrouter/policy/policy.yaml
policy_reload: {enabled: true, interval_seconds: 2}
backends:
  static: [http://vllm-0.vllm:8000]
  dns: {name: vllm-headless.default.svc.cluster.local, port: 8000, scheme: http, interval_seconds: 10}
  models_refresh_seconds: 30
health: {path: /health, interval_seconds: 5, timeout_seconds: 2, eject_after_failures: 3, readmit_backoff_seconds: 5, readmit_backoff_max_seconds: 60}
timeouts: {connect_seconds: 5, first_byte_seconds: 300, idle_stream_seconds: 120}
limits: {max_body_bytes: 16777216, max_attempts: 3}
admin_token_env: KVROUTER_ADMIN_TOKEN
gossip: {enabled: false, port: 7946, dns: "", peers: [], secret_env: KVROUTER_GOSSIP_SECRET, tls: {cert_file: "", key_file: "", ca_file: ""}}
"""  # noqa: E501


def test_config_chart_shape_loads_every_field() -> None:
    c = load_config_text(CHART_SHAPE, "values.yaml")
    assert (c.listen.host, c.listen.port) == ("0.0.0.0", 8000)
    assert c.policy == "/etc/kvrouter/policy/policy.yaml"
    assert c.policy_reload.enabled and c.policy_reload.interval_seconds == 2
    assert c.engines.static == ("http://vllm-0.vllm:8000",)
    dns = DnsEngines("vllm-headless.default.svc.cluster.local", 8000, "http", 10)
    assert c.engines.dns == (dns,)
    assert c.engines.models_refresh_seconds == 30
    h = c.health
    assert (h.path, h.interval_seconds, h.timeout_seconds, h.eject_after_failures) == (
        "/health",
        5,
        2,
        3,
    )
    assert (h.readmit_backoff_seconds, h.readmit_backoff_max_seconds) == (5, 60)
    t = c.timeouts
    assert (t.connect_seconds, t.first_byte_seconds, t.idle_stream_seconds) == (5, 300, 120)
    assert (c.limits.max_body_bytes, c.limits.max_attempts) == (16777216, 3)
    assert c.admin_token_env == "KVROUTER_ADMIN_TOKEN"
    assert not c.gossip.enabled and c.gossip.port == 7946 and c.gossip.peers == ()
    assert c.gossip.secret_env == "KVROUTER_GOSSIP_SECRET" and c.gossip.tls.cert_file == ""


def test_config_chart_shape_equals_defaults_but_engines() -> None:
    c = load_config_text(CHART_SHAPE, "values.yaml")
    d = Config()
    assert (c.listen, c.policy_reload, c.health, c.timeouts, c.limits, c.gossip) == (
        d.listen,
        d.policy_reload,
        d.health,
        d.timeouts,
        d.limits,
        d.gossip,
    )


# Not keys of their own: filled from the {url, api_key_env} entries of engines.static, and the
# spelling the file gave the section.
DERIVED = {
    "engines.static_key_envs",
    "engines.static_kinds",
    "engines.static_roles",
    "engines.static_bootstrap_ports",
    "engines.section",
    "source",
}


def documented_example() -> Any:
    """The YAML example in the settings module's docstring, parsed."""
    doc = router.gateway.config.settings.__doc__ or ""
    block = doc.split("::\n", 1)[1].split("\n\n", 1)[0]
    return yaml.safe_load(textwrap.dedent(block))


def field_paths(cls: type, prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaf fields, sections) of a config dataclass, as dotted paths."""
    leaves: set[str] = set()
    sections: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = inner[0] if isinstance(hint, types.UnionType) and len(inner) == 1 else hint
        if dataclasses.is_dataclass(kind):
            sections.add(path)
            sub_leaves, sub_sections = field_paths(typing.cast(type, kind), f"{path}.")
            leaves |= sub_leaves
            sections |= sub_sections
        else:
            leaves.add(path)
    return leaves, sections


def example_paths(data: Any, sections: set[str], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        if path in sections:
            assert isinstance(value, dict), f"{path}: a section, written as {value!r}"
            out |= example_paths(value, sections, f"{path}.")
        else:
            out.add(path)
    return out


def test_docstring_example_names_every_field() -> None:
    leaves, sections = field_paths(Config)
    written, fields = example_paths(documented_example(), sections), leaves - DERIVED
    assert (sorted(fields - written), sorted(written - fields)) == ([], []), "(missing, unknown)"


def test_docstring_example_gives_every_default() -> None:
    assert parse_config(documented_example(), "docstring") == Config()


def test_config_empty_file_is_defaults() -> None:
    assert load_config_text("", "empty.yaml") == Config()


def test_config_empty_dns_name_means_no_dns() -> None:
    c = load_config_text("backends: {dns: {name: '', port: 8000}}", "c.yaml")
    assert c.engines.dns == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: {hots: x}", "c.yaml: listen.hots: unknown field"),
        ("listen: {port: 'eighty'}", "c.yaml: listen.port: must be an integer from 0 to 65535"),
        ("backends: {static: http://a}", "c.yaml: backends.static: must be a list, got"),
        ("backends: {static: [ftp://a]}", "c.yaml: backends.static[0]: must start with http://"),
        ("backends: {static: ['http://a?x=1']}", "backends.static[0]: must not carry a query"),
        ("backends: {static: [3]}", "c.yaml: backends.static[0]: must be a URL or {url: URL"),
        ("engines: {static: [{api_key_env: K}]}", "c.yaml: engines.static[0].url: is required"),
        ("engines: {static: [{url: http://a, key: x}]}", "engines.static[0].key: unknown field"),
        ("engines: {static: [{url: 'ftp://a'}]}", "engines.static[0]: must start with http"),
        ("engines: {dns: {name: a, api_key_env: [K]}}", "engines.dns.api_key_env: must be a str"),
        ("backends: {dns: {name: a, scheme: udp}}", "backends.dns.scheme: must be one of http"),
        ("engines: {static: [{url: http://a, kind: tgi}]}", "static[0].kind: must be one of vllm"),
        ("engines: {dns: {name: a, kind: 1}}", "engines.dns.kind: must be a string"),
        ("health: {path: health}", "c.yaml: health.path: must start with '/'"),
        (
            "health: {readmit_backoff_seconds: 10, readmit_backoff_max_seconds: 5}",
            "health.readmit_backoff_max_seconds: must not be below readmit_backoff_seconds",
        ),
        ("health: {eject_after_failures: 0}", "health.eject_after_failures: must be an integer"),
        ("timeouts: {first_byte_seconds: -1}", "timeouts.first_byte_seconds: must be a number"),
        ("limits: {max_attempts: true}", "limits.max_attempts: must be an integer from 1 to 16"),
        ("gossip: {tls: {cert: x}}", "c.yaml: gossip.tls.cert: unknown field"),
        ("gossip: {peers: [1]}", "c.yaml: gossip.peers[0]: must be a string"),
        ("policy_reload: yes", "c.yaml: policy_reload: must be a mapping"),
        ("- a\n- b", "c.yaml: (top level): must be a mapping"),
        ("listen: {host: [", "c.yaml: line 1, column 17: invalid YAML"),
        ("extra: 1", "c.yaml: extra: unknown field"),
        ("limits: {max_connections: 0}", "limits.max_connections: must be an integer from 1"),
        ("limits: {header_timeout_seconds: 0}", "limits.header_timeout_seconds: must be a number"),
        ("limits: {keepalive_timeout_seconds: x}", "limits.keepalive_timeout_seconds: must be"),
        ("limits: {large_body_bytes: -1}", "limits.large_body_bytes: must be an integer from 0"),
        ("limits: {max_large_body_parses: 0}", "limits.max_large_body_parses: must be an integer"),
        ("limits: {max_attempts: " + "9" * 400 + "}", "limits.max_attempts: must be an integer"),
        ("timeouts: {connect_seconds: " + "9" * 400 + "}", "timeouts.connect_seconds: must be"),
        ("1: a", "c.yaml: 1: unknown field"),
        ("listen: !!timestamp x", "c.yaml: invalid YAML"),
    ],
    ids=lambda v: v if len(v) < 30 else v[:30],
)
def test_config_invalid_error_names_file_and_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "c.yaml")
    assert expected in str(e.value)


def test_config_engine_kinds_by_static_entry_and_dns_name() -> None:
    text = (
        "engines: {static: [http://a, {url: 'http://b:9000/', kind: sglang}],"
        " dns: {name: sg, kind: sglang}}"
    )
    e = load_config_text(text, "c.yaml").engines
    assert e.static_kinds == {"http://b:9000": "sglang"}
    found = ("http://10.1.1.1:8000", "dns:sg")
    assert [e.kind_of(*u) for u in (("http://a:80",), ("http://b:9000",), found)] == [
        "vllm",
        "sglang",
        "sglang",
    ]
    assert not e.disaggregated and e.role_of(*found) == "both"


def test_config_engine_roles_by_static_entry_and_dns_name_per_pool() -> None:
    text = """
engines:
  static:
    - {url: http://p:8000, role: prefill, kind: sglang, bootstrap_port: 8998}
    - {url: http://d:8000, role: decode}
    - http://x:8000
  dns:
    - {name: prefill.svc, role: prefill, bootstrap_port: 9000}
    - {name: decode.svc, port: 8100, role: decode}
disaggregation: {protocol: sglang, link_gbps: 400, model: {layers: 80, kv_heads: 8, head_dim: 128}}
"""
    c = load_config_text(text, "c.yaml")
    e = c.engines
    assert e.disaggregated
    assert e.static_roles == {"http://p:8000": "prefill", "http://d:8000": "decode"}
    assert [e.role_of(u) for u in ("http://p:8000", "http://d:8000", "http://x:8000")] == [
        "prefill",
        "decode",
        "both",
    ]
    assert [d.source for d in e.dns] == ["dns:prefill.svc", "dns:decode.svc"]
    assert e.role_of("http://10.0.0.1:8000", "dns:prefill.svc") == "prefill"
    assert e.role_of("http://10.0.0.2:8100", "dns:decode.svc") == "decode"
    assert e.bootstrap_port_of("http://p:8000") == 8998
    assert e.bootstrap_port_of("http://10.0.0.1:8000", "dns:prefill.svc") == 9000
    assert e.bootstrap_port_of("http://10.0.0.2:8100", "dns:decode.svc") is None
    d = c.disaggregation
    assert (d.protocol, d.link_gbps, d.kv_bytes_per_token) == ("sglang", 400, 327_680)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("engines: {static: [{url: 'http://a', role: leader}]}", "engines.static[0].role: must be"),
        ("engines: {static: [{url: 'http://a', bootstrap_port: 0}]}", "bootstrap_port: must be"),
        ("engines: {static: [http://a, 'http://a:80']}", "is listed twice"),
        ("engines: {dns: [a]}", "engines.dns[0]: must be"),
        ("engines: {dns: [{name: a}, {name: a, role: decode}]}", "is listed twice"),
        ("engines: {dns: [{name: a, api_key_env: K}, {name: b}]}", "the same api_key_env"),
        ("disaggregation: {protocol: grpc}", "disaggregation.protocol: must be one of"),
        ("disaggregation: {link_gbps: 0}", "disaggregation.link_gbps: must be a number"),
        ("disaggregation: {model: {layers: 2}}", "disaggregation.model.kv_heads: is required"),
        (
            "disaggregation: {kv_bytes_per_token: 9, model: {layers: 1, kv_heads: 1, head_dim: 1}}",
            "not both",
        ),
        ("disaggregation: {stay_below: 9}", "disaggregation.stay_below: unknown field"),
    ],
)
def test_config_disaggregation_errors_name_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(text, "c.yaml")
    assert expected in str(e.value)


def test_prefill_and_decode_flags_replace_the_static_engines() -> None:
    base = load_config_text("engines: {static: [{url: 'http://a', role: decode}]}", "c.yaml")
    o = with_overrides(
        base,
        engines=["http://a"],
        prefill=[["http://p:8000", "8998"], ["http://q:8000"]],
        decode=["http://d:8000"],
    )
    e = o.engines
    assert e.static == ("http://a:80", "http://p:8000", "http://q:8000", "http://d:8000")
    assert e.static_roles == {
        "http://a:80": "decode",  # --engine keeps the file's role
        "http://p:8000": "prefill",
        "http://q:8000": "prefill",
        "http://d:8000": "decode",
    }
    assert e.static_bootstrap_ports == {"http://p:8000": 8998}
    for bad, says in (
        ([["http://p", "x"]], "bootstrap port"),
        ([["http://p", "1", "2"]], "takes URL [BOOTSTRAP_PORT]"),
        ([["ftp://p"]], "--prefill: must start with"),
    ):
        with pytest.raises(ConfigError, match=re.escape(says)):
            with_overrides(base, prefill=bad)
    with pytest.raises(ConfigError, match="given twice"):
        with_overrides(base, prefill=[["http://p"]], decode=["http://p:80"])


def test_config_unreadable_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_config(missing)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://a:8000/", "http://a:8000"),
        ("HTTPS://A.example", "https://a.example:443"),
        ("http://a.example:80/", "http://a.example:80"),
        ("http://[::1]:9000", "http://[::1]:9000"),
        ("http://[0:0::0001]:9000//", "http://[::1]:9000"),
        ("http://h:1/prefix/", "http://h:1/prefix"),
    ],
    ids=["trailing-slash", "case-default-port", "explicit-default", "v6", "v6-compressed", "path"],
)
def test_engine_url_normalised(text: str, url: str) -> None:
    assert engine_url(text) == url


def test_overrides_flags_replace_file_values() -> None:
    c = load_config_text(CHART_SHAPE, "values.yaml")
    o = with_overrides(
        c,
        engines=["http://127.0.0.1:9/"],
        engine_dns="engines.local:9100",
        policy="round-robin",
        host="127.0.0.1",
        port=0,
    )
    assert o.engines.static == ("http://127.0.0.1:9",)
    assert o.engines.dns == (DnsEngines("engines.local", 9100, "http", 10),)
    assert (o.policy, o.listen.host, o.listen.port) == ("round-robin", "127.0.0.1", 0)
    assert o.health == c.health


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"engines": ["localhost:8000"]}, "--engine: must start with http://"),
        ({"engine_dns": "engines"}, "--engine-dns: must be HOST:PORT"),
        ({"engine_dns": "engines:0"}, "--engine-dns: must be HOST:PORT"),
    ],
)
def test_overrides_bad_flag_names_it(kwargs: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        with_overrides(Config(), **kwargs)  # type: ignore[arg-type]


def test_check_no_engines_says_how_to_give_one() -> None:
    with pytest.raises(ConfigError, match="no engines: give --engine URL"):
        check_ready_to_serve(Config())


@pytest.mark.parametrize("flag", ["--engine", "--backend"])
def test_serve_engine_flag_and_its_released_spelling_both_work(flag: str) -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args([flag, "http://127.0.0.1:1", f"{flag}-dns", "engines.local:9"])
    c = serve.config_from_args(args)
    assert c.engines.static == ("http://127.0.0.1:1",)
    assert c.engines.dns == (DnsEngines("engines.local", 9),)


@pytest.mark.parametrize("key", ["engines", "backends"])
def test_config_engines_section_and_its_released_spelling_both_load(key: str) -> None:
    c = load_config_text(f"{key}: {{static: [http://10.0.0.1:8000]}}\n", "c.yaml")
    assert c.engines.static == ("http://10.0.0.1:8000",)


def test_config_engines_and_backends_together_is_an_error() -> None:
    text = "engines: {static: [http://a:1]}\nbackends: {static: [http://b:1]}\n"
    with pytest.raises(ConfigError, match="either 'engines' or its older spelling 'backends'"):
        load_config_text(text, "c.yaml")


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    ns = parser.parse_args([])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_config_from_args_defaults_listen_on_every_interface() -> None:
    c = serve.config_from_args(_args(engines=["http://127.0.0.1:1"]))
    assert (c.listen.host, c.listen.port, c.policy) == ("0.0.0.0", 8000, "kv-aware")


def test_serve_bad_config_exits_2_with_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "serve.yaml"
    bad.write_text("limits: {max_attempts: 0}\n")
    assert main(["serve", "--config", str(bad), "--backend", "http://127.0.0.1:1"]) == 2
    assert "limits.max_attempts: must be an integer from 1 to 16" in capsys.readouterr().err


def test_serve_bad_policy_exits_2_with_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("name: x\nscorers: [{type: load}]\n")
    argv = ["serve", "--policy", str(bad), "--backend", "http://127.0.0.1:1", "--port", "0"]
    assert main(argv) == 2
    assert "scorers[0].weight: is required" in capsys.readouterr().err


def test_serve_no_engine_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "0"]) == 2
    assert "no engines" in capsys.readouterr().err


def test_config_limits_for_clients_load_with_defaults() -> None:
    d = Config().limits
    assert (d.max_connections, d.header_timeout_seconds, d.keepalive_timeout_seconds) == (
        2048,
        10.0,
        75.0,
    )
    assert (d.large_body_bytes, d.max_large_body_parses) == (1024 * 1024, 1)
    c = load_config_text(
        "limits: {max_connections: 16, header_timeout_seconds: 0.5, "
        "keepalive_timeout_seconds: 5, large_body_bytes: 0, max_large_body_parses: 2}",
        "c.yaml",
    ).limits
    assert (c.max_connections, c.header_timeout_seconds, c.keepalive_timeout_seconds) == (
        16,
        0.5,
        5.0,
    )
    assert (c.large_body_bytes, c.max_large_body_parses) == (0, 2)


def test_config_file_over_size_limit_names_it(tmp_path: Path) -> None:
    p = tmp_path / "serve.yaml"
    p.write_text("limits: {max_attempts: 3}\n" + "#" * MAX_YAML_BYTES)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}: ") and "limit" in str(e.value)


def test_config_alias_bomb_refused() -> None:
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{k}: &{k} [{','.join(['*' + p] * 9)}]\n"
        for p, k in zip("abcdefgh", "bcdefghi", strict=True)
    )
    with pytest.raises(ConfigError, match="aliases"):
        load_config_text(bomb + "policy: *i\n", "bomb.yaml")


# -- fuzzing: a config file is a Config or a ConfigError, never anything else ----------------

config_keys = st.sampled_from(
    ["listen", "host", "port", "policy", "policy_reload", "enabled", "interval_seconds",
     "engines", "backends", "static", "dns", "name", "scheme", "models_refresh_seconds",
     "health", "path", "timeout_seconds", "eject_after_failures", "timeouts",
     "connect_seconds", "limits", "max_body_bytes", "max_attempts", "max_connections",
     "header_timeout_seconds", "keepalive_timeout_seconds", "large_body_bytes",
     "max_large_body_parses", "admin_token_env", "gossip", "peers", "tls", "cert_file",
     "flow_control", "max_queue", "metrics_port", "drain", "grace_seconds", "api_key_env",
     "url", "auth", "forwarding", "kv_events", "engine_metrics"]
)  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["http://a:1", "a:1", "http", "/health", "lan"])
)
configs = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(config_keys | st.integers(), inner),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(configs.map(yaml.safe_dump), st.text(max_size=200)))
def test_fuzz_config_any_file_config_or_config_error(text: str) -> None:
    try:
        got = load_config_text(text, "fuzz.yaml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.yaml: ")
        return
    assert isinstance(got, Config)


@pytest.mark.parametrize("key", ["engines", "backends"])
def test_check_tokenizer_without_events_names_the_section_as_written(key: str) -> None:
    cfg = load_config_text(f"{key}: {{static: [http://a:1], kv_events: {{tokenizer: /t}}}}", "c")
    assert cfg.engines.key("kv_events.tokenizer") == f"{key}.kv_events.tokenizer"
    with pytest.raises(ConfigError, match=rf"^{key}\.kv_events\.tokenizer \(--tokenizer\): "):
        check_ready_to_serve(cfg)


def test_config_engines_and_backends_spellings_are_one_config() -> None:
    text = "{}: {{static: [http://10.0.0.1:8000]}}\n"
    assert load_config_text(text.format("engines"), "c") == load_config_text(
        text.format("backends"), "c"
    )


def test_kv_events_tokenizer_is_engine_or_a_path(tmp_path: Path) -> None:
    def tokenizer(value: str) -> str:
        data = {"backends": {"kv_events": {"port": 5557, "tokenizer": value}}}
        return parse_config(data).engines.kv_events.tokenizer

    assert tokenizer("engine") == "engine"
    # A path is read where the gateway runs, when it starts (test_local_tokenizer_live).
    assert tokenizer(str(tmp_path / "absent")) == str(tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"backends\.kv_events\.tokenizer: must be 'engine'"):
        tokenizer(" ")


def test_check_kv_events_for_no_engine_names_it_and_the_engines_it_could_mean() -> None:
    cfg = with_kv_events(
        with_overrides(Config(), engines=["http://127.0.0.1:8001", "http://127.0.0.1:8002"]),
        endpoints=["http://localhost:8001=tcp://127.0.0.1:5557"],
    )
    with pytest.raises(ConfigError) as e:
        check_ready_to_serve(cfg)
    msg = str(e.value)
    assert msg.startswith("engines.kv_events.endpoints (--kv-events): no engine has the URL ")
    assert "http://localhost:8001 (engines: http://127.0.0.1:8001)" in msg
    assert "8002" not in msg  # only the engines on the same port are offered


def test_check_kv_events_spelled_differently_but_the_same_engine_pass() -> None:
    cfg = with_kv_events(
        with_overrides(Config(), engines=["HTTP://127.0.0.1:8001/"]),
        endpoints=["http://127.0.0.1:8001=tcp://127.0.0.1:5557"],
    )
    check_ready_to_serve(cfg)


def test_check_kv_events_with_dns_discovery_accept_any_engine_url() -> None:
    cfg = with_kv_events(
        with_overrides(Config(), engine_dns="engines.svc:8000"),
        endpoints=["http://10.0.0.7:8000=tcp://10.0.0.7:5557"],
    )
    check_ready_to_serve(cfg)
