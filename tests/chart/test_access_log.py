"""The chart's access-log and route-header values reach the router's config as it loads them."""

from __future__ import annotations

import pytest

from tests.chart.support import merged_values, render


def test_access_log_defaults_are_the_router_defaults() -> None:
    from router.gateway.config.access_log import AccessLogSettings
    from router.gateway.config.settings import Config, load_config_text

    router = merged_values({})["router"]
    d = AccessLogSettings()
    assert router["accessLog"] == {"enabled": d.enabled, "sample": d.sample}
    assert router["routeHeaders"] is Config().route_headers is False
    config = load_config_text(render({}).router_config_text(), "config.yaml")
    assert (config.access_log, config.route_headers) == (d, False)


@pytest.mark.parametrize(
    ("enabled", "sample", "headers"), [(False, 1, False), (True, 0.05, True), (True, 0, False)]
)
def test_access_log_values_reach_the_router(enabled: bool, sample: float, headers: bool) -> None:
    from router.gateway.config.settings import load_config_text

    log = {"enabled": enabled, "sample": sample}
    values = {"router": {"accessLog": log, "routeHeaders": headers}}
    config = load_config_text(render(values).router_config_text(), "config.yaml")
    assert (config.access_log.enabled, config.access_log.sample) == (enabled, sample)
    assert config.route_headers is headers
