"""The prefill and decode pools and the disaggregation section reach the router's config.

Each pool (router.backends.prefill, router.backends.decode) is engines by URL, a DNS name or a
headless Service; the config file gets them as engines with a role (static entries and a list
of DNS names), and router.disaggregation as its ``disaggregation`` section, with the KV
cache's bytes per token given or worked out from the model's shape. Without pools the file is
what it always was.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.chart.support import CLUSTER_DOMAIN, NAMESPACE, render, rendered

# The example the README's arithmetic uses: 80 layers, 8 KV heads, 128 dims, FP16.
LLAMA_70B = {"layers": 80, "kvHeads": 8, "headDim": 128, "bytesPerValue": 2}
LLAMA_70B_BYTES = 327_680

VLLM_POOLS = {
    "prefill": {"static": ["http://prefill-0.prefill:8000", "http://prefill-1.prefill:8000"]},
    "decode": {"static": ["http://decode-0.decode:8000"]},
}


def _values(backends: dict[str, Any], disaggregation: dict[str, Any] | None = None) -> Any:
    router: dict[str, Any] = {"backends": backends}
    if disaggregation is not None:
        router["disaggregation"] = disaggregation
    return {"router": router}


def _loaded(values: dict[str, Any]) -> Any:
    from router.gateway.config.settings import load_config_text

    return load_config_text(render(values).router_config_text(), "config.yaml")


def test_pools_static_engines_written_with_their_roles() -> None:
    config = render(_values(VLLM_POOLS)).router_config()
    assert config["backends"]["static"] == [
        {"role": "prefill", "url": "http://prefill-0.prefill:8000"},
        {"role": "prefill", "url": "http://prefill-1.prefill:8000"},
        {"role": "decode", "url": "http://decode-0.decode:8000"},
    ]
    assert config["disaggregation"] == {
        "protocol": "vllm",
        "link_gbps": 100,
        "prefill_tokens_per_s": 10000,
        "decider": "cost",
        "threshold_tokens": 16,
    }
    assert "dns" not in config["backends"]


def test_pools_model_shape_passed_to_the_router_as_its_model_section() -> None:
    section = render(_values(VLLM_POOLS, {"model": LLAMA_70B})).router_config()["disaggregation"]
    assert section["model"] == {"layers": 80, "kv_heads": 8, "head_dim": 128, "bytes_per_value": 2}
    assert "kv_bytes_per_token" not in section


def test_pools_static_engines_load_with_their_roles() -> None:
    engines = _loaded(_values(VLLM_POOLS)).engines
    assert engines.role_of("http://prefill-1.prefill:8000") == "prefill"
    assert engines.role_of("http://decode-0.decode:8000") == "decode"


def test_pools_beside_engines_of_both_roles_keep_them() -> None:
    backends = {**VLLM_POOLS, "static": ["http://both-0.both:8000"]}
    engines = _loaded(_values(backends)).engines
    assert engines.role_of("http://both-0.both:8000") == "both"
    assert engines.role_of("http://prefill-0.prefill:8000") == "prefill"


def test_pools_service_becomes_its_dns_name_in_the_release_namespace() -> None:
    backends = {
        "prefill": {"service": "vllm-prefill", "port": 8100},
        "decode": {"dnsName": "vllm-decode.other.svc.cluster.local", "port": 8200},
    }
    dns = render(_values(backends)).router_config()["backends"]["dns"]
    assert [(d["name"], d["port"], d["role"]) for d in dns] == [
        (f"vllm-prefill.{NAMESPACE}.svc.{CLUSTER_DOMAIN}", 8100, "prefill"),
        ("vllm-decode.other.svc.cluster.local", 8200, "decode"),
    ]
    assert all((d["scheme"], d["interval_seconds"]) == ("http", 10) for d in dns)


def test_pools_dns_names_join_the_both_roles_name_in_a_list() -> None:
    both = {"name": "vllm-headless", "port": 8000, "scheme": "http", "intervalSeconds": 5}
    backends = {"dns": both, "decode": {"service": "vllm-decode", "port": 8000}}
    dns = render(_values(backends)).router_config()["backends"]["dns"]
    assert [(d["name"], d.get("role", "both"), d["interval_seconds"]) for d in dns] == [
        ("vllm-headless", "both", 5),
        (f"vllm-decode.{NAMESPACE}.svc.{CLUSTER_DOMAIN}", "decode", 5),
    ]


def test_pools_sglang_scenario_loads_with_roles_bootstrap_port_and_settings() -> None:
    from router.gateway.config.settings import load_config_text

    config = load_config_text(rendered("disaggregated").router_config_text(), "config.yaml")
    settings = config.disaggregation
    assert (settings.protocol, settings.link_gbps) == ("sglang", 400)
    assert settings.kv_bytes_per_token == LLAMA_70B_BYTES
    engines, address = config.engines, "http://10.0.0.7:30000"
    prefill, decode = (f"dns:{d.name}" for d in engines.dns)
    assert prefill == f"dns:sglang-prefill-headless.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"
    assert [engines.role_of(address, s) for s in (prefill, decode)] == ["prefill", "decode"]
    assert [engines.bootstrap_port_of(address, s) for s in (prefill, decode)] == [8998, None]
    assert [engines.kind_of(address, s) for s in (prefill, decode)] == ["sglang", "sglang"]


def test_pools_sglang_static_prefill_engine_carries_its_bootstrap_port() -> None:
    backends = {
        "kind": "sglang",
        "prefill": {"static": ["http://p-0.p:30000"], "bootstrapPort": 8998},
        "decode": {"static": ["http://d-0.d:30000"]},
    }
    engines = _loaded(_values(backends, {"protocol": "sglang"})).engines
    assert engines.bootstrap_port_of("http://p-0.p:30000") == 8998
    assert engines.bootstrap_port_of("http://d-0.d:30000") is None
    assert engines.kind_of("http://d-0.d:30000") == "sglang"


@pytest.mark.parametrize(
    ("disaggregation", "expected"),
    [
        ({"model": LLAMA_70B}, LLAMA_70B_BYTES),
        ({"model": {**LLAMA_70B, "bytesPerValue": 1}}, LLAMA_70B_BYTES // 2),
        ({"kvBytesPerToken": 131072}, 131072),
    ],
    ids=["from-the-shape", "fp8-shape", "given"],
)
def test_pools_kv_bytes_per_token_reach_the_router(
    disaggregation: dict[str, Any], expected: int
) -> None:
    config = _loaded(_values(VLLM_POOLS, disaggregation))
    assert config.disaggregation.kv_bytes_per_token == expected


def test_pools_chart_defaults_are_the_router_defaults() -> None:
    from router.core.disaggregation import DisaggSettings

    assert _loaded(_values(VLLM_POOLS)).disaggregation == DisaggSettings()


def test_pools_decider_reaches_the_router() -> None:
    settings = {"decider": "threshold", "thresholdTokens": 512, "prefillTokensPerS": 25000.5}
    loaded = _loaded(_values(VLLM_POOLS, settings)).disaggregation
    assert (loaded.decider, loaded.threshold_tokens) == ("threshold", 512)
    assert loaded.prefill_tokens_per_s == 25000.5


def test_pools_unset_kv_bytes_per_token_leaves_the_router_default() -> None:
    from router.core.disaggregation import DEFAULT_KV_BYTES_PER_TOKEN

    assert "kv_bytes_per_token" not in render(_values(VLLM_POOLS)).router_config()["disaggregation"]
    config = _loaded(_values(VLLM_POOLS, {"linkGbps": 12.5}))
    assert config.disaggregation.kv_bytes_per_token == DEFAULT_KV_BYTES_PER_TOKEN
    assert config.disaggregation.link_gbps == 12.5


def test_pools_absent_config_has_no_disaggregation_and_one_dns_mapping() -> None:
    both = {"name": "vllm-headless", "port": 8000, "scheme": "http", "intervalSeconds": 10}
    config = render(_values({"dns": both}, {"protocol": "sglang"})).router_config()
    assert "disaggregation" not in config
    assert config["backends"]["dns"]["name"] == "vllm-headless"
    assert not _loaded(_values({"dns": both})).engines.disaggregated


def test_pools_only_no_warning_about_missing_engines() -> None:
    assert "no backends are configured" in render({}).notes
    notes = render(_values(VLLM_POOLS)).notes
    assert "no backends are configured" not in notes
    assert "Prefill/decode disaggregation (vllm protocol, 100 Gbps link)" in notes


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        (
            _values({"prefill": {"dnsName": "p.x", "service": "p"}}),
            r"router\.backends\.prefill: give dnsName or service, not both",
        ),
        (
            _values(VLLM_POOLS, {"kvBytesPerToken": 1024, "model": LLAMA_70B}),
            r"give kvBytesPerToken or the model's shape \(model\), not both",
        ),
        (
            _values(VLLM_POOLS, {"model": {"layers": 80, "kvHeads": 0, "headDim": 128}}),
            r"model needs layers, kvHeads and headDim together \(got 80, 0, 128\)",
        ),
        (
            {"mode": "epp", **_values(VLLM_POOLS)},
            r"router\.backends\.prefill and router\.backends\.decode are for mode: proxy",
        ),
    ],
    ids=["dns-name-and-service", "bytes-and-shape", "partial-shape", "epp-mode"],
)
def test_pools_inconsistent_values_fail_with_reason(values: dict[str, Any], reason: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=reason):
        render(values)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (_values({"prefill": {"static": ["prefill-0:8000"]}}), "/router/backends/prefill/static"),
        (_values({"decode": {"bootstrapPort": 8998}}), "bootstrapPort"),
        (_values({"decode": {"service": "Not_A_Name"}}), "/router/backends/decode/service"),
        (_values({"prefill": {"port": 0}}), "/router/backends/prefill/port"),
        (_values({}, {"protocol": "nixl"}), "/router/disaggregation/protocol"),
        (_values({}, {"linkGbps": 0}), "/router/disaggregation/linkGbps"),
        (_values({}, {"kvBytesPerToken": -1}), "/router/disaggregation/kvBytesPerToken"),
        (_values({}, {"model": {"heads": 8}}), "heads"),
        (_values({}, {"decider": "llm-d"}), "/router/disaggregation/decider"),
        (_values({}, {"prefillTokensPerS": 0}), "/router/disaggregation/prefillTokensPerS"),
    ],
    ids=[
        "static-not-a-url",
        "bootstrap-port-on-decode",
        "service-not-a-dns-label",
        "port-zero",
        "unknown-protocol",
        "link-zero",
        "bytes-negative",
        "unknown-shape-key",
        "unknown-decider",
        "prefill-rate-zero",
    ],
)
def test_pools_schema_bad_value_rejected_naming_the_key(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)
