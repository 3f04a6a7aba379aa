"""Engines' KV cache events in the chart: the port rule, the tokenizer volume, the refusals."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.chart.support import (
    SCENARIO_IDS,
    render,
    rendered,
)


def kv_events_values(**kv: Any) -> dict[str, Any]:
    return {"router": {"backends": {"kvEvents": kv}}}


@pytest.mark.parametrize("scenario", SCENARIO_IDS)
def test_kv_events_scenario_without_port_absent_from_config(scenario: str) -> None:
    """Port 0 (the default) is off: the file says nothing and the router keeps text keys."""
    from router.gateway.config.settings import parse_config

    config = rendered(scenario).router_config()
    assert "kv_events" not in config["backends"]
    assert not parse_config(config).engines.kv_events.enabled


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"port": 5557, "replayPort": 5558, "topic": "kv@"},
            {"port": 5557, "replay_port": 5558, "topic": "kv@"},
        ),
        ({"port": 5557}, {"port": 5557, "replay_port": 0, "topic": ""}),
    ],
    ids=["port-replay-topic", "port-only"],
)
def test_kv_events_port_set_config_has_the_port_rule(
    values: dict[str, Any], expected: dict[str, Any]
) -> None:
    from router.gateway.config.settings import parse_config

    config = render(kv_events_values(**values)).router_config()
    assert config["backends"]["kv_events"] == expected
    # The router's own strict loader reads it as the port rule for every engine's host.
    kv = parse_config(config, "config.yaml").engines.kv_events
    assert (kv.port, kv.replay_port, kv.topic) == (
        expected["port"],
        expected["replay_port"],
        expected["topic"],
    )
    assert kv.enabled and dict(kv.endpoints) == {}


def test_kv_events_change_pod_template_changes_to_restart() -> None:
    """config.yaml is read once at start: setting or changing the port rolls the pods."""

    def checksum(values: dict[str, Any]) -> str:
        template = render(values).router_deployment()["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/config"])

    off = checksum({})
    assert checksum(kv_events_values(port=0)) == off
    assert (
        len({off, checksum(kv_events_values(port=5557)), checksum(kv_events_values(port=5559))})
        == 3
    )


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (kv_events_values(port=70000), "/router/backends/kvEvents/port"),
        (kv_events_values(port=-1), "/router/backends/kvEvents/port"),
        (kv_events_values(replayPort="5558"), "/router/backends/kvEvents/replayPort"),
        (kv_events_values(topic=7), "/router/backends/kvEvents/topic"),
        (kv_events_values(endpoint="tcp://vllm:5557"), "endpoint"),
    ],
    ids=["port-out-of-range", "port-negative", "replay-port-string", "topic-number", "unknown"],
)
def test_kv_events_schema_bad_value_rejected_naming_the_key(
    values: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        render(values)
    assert where in str(err.value)


@pytest.mark.parametrize(
    "values",
    [
        {"replayPort": 5558},
        {"topic": "kv"},
        {"tokenizer": {"volume": {"emptyDir": {}}, "path": ""}},
    ],
    ids=["replay-port-without-port", "topic-without-port", "tokenizer-without-port"],
)
def test_kv_events_settings_without_port_fail_with_reason(values: dict[str, Any]) -> None:
    """A replay port or topic with events off would be silently ignored: refuse it instead."""
    with pytest.raises(helm_python.HelmRenderError, match=r"kvEvents\.port is required"):
        render(kv_events_values(**values))


def test_kv_events_tokenizer_volume_is_mounted_where_the_config_reads_it() -> None:
    from router.gateway.config.settings import parse_config

    claim = {"persistentVolumeClaim": {"claimName": "model-weights", "readOnly": True}}
    tokenizer = {"volume": claim, "path": "llama-3.1-8b/"}
    out = render(kv_events_values(port=5557, tokenizer=tokenizer))
    path = parse_config(out.router_config()).engines.kv_events.tokenizer
    assert path == "/etc/kvrouter/tokenizer/llama-3.1-8b"
    mount, volume = out.mount_for_file(path + "/tokenizer.json")
    assert mount["readOnly"] is True
    assert volume == {"name": "tokenizer", **claim}
    # Without a volume the engines tokenize: no mount, and the config says nothing.
    plain = render(kv_events_values(port=5557))
    assert "tokenizer" not in plain.router_config()["backends"]["kv_events"]
    with pytest.raises(AssertionError, match="on no volume mount"):
        plain.mount_for_file("/etc/kvrouter/tokenizer/tokenizer.json")


@pytest.mark.parametrize(
    ("tokenizer", "error", "reason"),
    [
        ({"volume": {"emptyDir": {}}, "path": "/abs"}, helm_python.HelmValuesError, "path"),
        ({"volume": {"emptyDir": {}}, "path": "a/../.."}, helm_python.HelmRenderError, r"\.\."),
        ({"volume": {"emptyDir": {}}, "path": "", "x": 1}, helm_python.HelmValuesError, "x"),
    ],
    ids=["absolute-path", "dot-dot", "unknown-key"],
)
def test_kv_events_tokenizer_bad_values_fail_with_reason(
    tokenizer: dict[str, Any], error: type[Exception], reason: str
) -> None:
    with pytest.raises(error, match=reason):
        render(kv_events_values(port=5557, tokenizer=tokenizer))


def test_kv_events_network_policy_leaves_egress_to_the_engines_open() -> None:
    """The router subscribes to the engines' event ports: no egress rule may shut them out."""
    out = render(kv_events_values(port=5557, replayPort=5558))
    (policy,) = out.of_kind("NetworkPolicy")
    assert "Egress" not in policy["spec"]["policyTypes"]
    assert "egress" not in policy["spec"]
