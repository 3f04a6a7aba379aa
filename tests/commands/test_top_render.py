"""``kvrouter top``'s drawing: what a view looks like on an 120-column terminal."""

from __future__ import annotations

from rich.console import Console

from router.commands.top import render
from router.commands.top_model import EngineSample, RouterSample, fleet_view


def screen(*routers: RouterSample) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(render(fleet_view(list(routers)), 2.0))
    return console.export_text()


def test_render_names_an_unreachable_router_and_unknowns_as_dashes() -> None:
    up = RouterSample(
        "http://r1:8000",
        0.0,
        ready=True,
        policy="kv-aware",
        engines={"http://e1:8000": EngineSample("http://e1:8000", True, inflight=3)},
    )
    down = RouterSample("http://r2:8000", 0.0, error="connection refused")
    text = screen(up, down)
    assert "http://r2:8000: unreachable (connection refused)" in text
    (row,) = [line for line in text.splitlines() if line.startswith("http://e1:8000")]
    assert row.split() == ["http://e1:8000", "healthy", "3", "-", "-", "-", "-", "-", "-"]
    assert "policy kv-aware" in text and "1 of 1 engines" in text
