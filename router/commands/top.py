"""``kvrouter top URL [URL ...]``: a live table of the fleet as its routers see it.

Every ``--interval`` seconds each router's public endpoints are read (``/metrics``, ``/ready``,
``/v1/models``, and ``/debug/backends`` when the variable ``--admin-token-env`` names holds the
admin token: per engine health states and models), merged by router.commands.top_model and
drawn with Rich's ``Live`` on the terminal's alternate screen: one row per engine, red where
an engine is out or failing, yellow where it queues or fills its KV cache. Several URLs are
the replicas of one gossiping fleet: their in-flight requests and rates add up.

Keys: ``s`` the next sort column, ``m`` the next model to show only the engines serving it
(needs the admin token: only ``/debug/backends`` says which engine serves what), ``q`` quit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from router.commands.top_model import (
    KV_FULL,
    SORTS,
    FleetView,
    RouterSample,
    Row,
    fleet_view,
    next_of,
    sample,
)

DEFAULT_TOKEN_ENV = "KVROUTER_ADMIN_TOKEN"
# Each endpoint's answer within this, or the router shows as unreachable for that refresh.
FETCH_TIMEOUT_SECONDS = 3.0
MIN_INTERVAL_SECONDS = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "urls", nargs="+", metavar="URL", help="a router's base URL (several: a fleet's replicas)"
    )
    parser.add_argument(
        "--admin-token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="NAME",
        help="variable holding the admin token, for per-engine states and models "
        f"(default {DEFAULT_TOKEN_ENV}; unset: /metrics alone)",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes"
    )


async def _get(
    http: aiohttp.ClientSession, url: str, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    async with http.get(url, headers=headers) as r:
        return r.status, await r.read()


def _json(status: int, body: bytes) -> Any:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    # /ready answers 503 with its JSON while the router is not ready.
    return value if isinstance(value, dict) and (status < 500 or status == 503) else None


async def read_router(
    http: aiohttp.ClientSession, url: str, token: str | None, now: float
) -> RouterSample:
    """One router's ``RouterSample``, or one naming why it could not be read."""
    admin = {"Authorization": f"Bearer {token}"} if token else None
    calls = [_get(http, f"{url}{p}") for p in ("/metrics", "/ready", "/v1/models")]
    if admin is not None:
        calls.append(_get(http, f"{url}/debug/backends", admin))
    try:
        answers = await asyncio.gather(*calls)
    except (aiohttp.ClientError, TimeoutError) as e:
        return RouterSample(url, now, error=str(e) or type(e).__name__)
    (status, metrics), ready, models = answers[:3]
    if status != 200:
        return RouterSample(url, now, error=f"/metrics answered {status}")
    backends = _json(*answers[3]) if len(answers) > 3 and answers[3][0] == 200 else None
    return sample(
        url, now, metrics.decode("utf-8", "replace"), _json(*ready), _json(*models), backends
    )


def _num(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _tokens(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:.1f}{unit}"
    return f"{v:.0f}"


def _style(row: Row, column: str) -> str:
    if column not in row.trouble():
        return ""
    if (column == "kv" and (row.kv_usage or 0.0) < KV_FULL) or column == "waiting":
        return "yellow"
    return "bold red"


COLUMNS = ("engine", "health", "inflight", "running", "waiting", "kv", "req/s", "reach", "got")
HEADINGS = {
    "inflight": "in-flight",
    "running": "running",
    "waiting": "waiting",
    "kv": "KV used",
    "reach": "reachable tok",
    "got": "achieved/reach",
}


def _cells(row: Row) -> dict[str, str]:
    return {
        "engine": row.engine,
        "health": row.health,
        "inflight": _num(row.inflight),
        "running": _num(row.running),
        "waiting": _num(row.waiting),
        "kv": _pct(row.kv_usage),
        "req/s": _num(row.rps, 1),
        "reach": _tokens(row.reachable),
        "got": _pct(row.got),
    }


def render(view: FleetView, interval: float) -> Group:
    """The whole screen for one view: the fleet's line, the routers in trouble, the table."""
    policies = sorted({r.policy for r in view.routers if r.policy})
    head = Text.assemble(
        ("kvrouter top", "bold"),
        f"  {len(view.routers)} router(s)  policy {', '.join(policies) or '-'}",
        f"  {_num(view.rps, 1)} req/s  queued {_num(view.queued)}",
        f"  hit ratio: reachable {_pct(view.reachable_ratio)}  achieved {_pct(view.hit_ratio)}",
    )
    lines: list[Text | Table] = [head]
    for r in view.routers:
        if r.error:
            lines.append(Text(f"  {r.url}: unreachable ({r.error})", style="bold red"))
        elif not r.ready:
            lines.append(Text(f"  {r.url}: not ready", style="yellow"))
    table = Table(expand=False, pad_edge=False, box=None, header_style="bold")
    for c in COLUMNS:
        heading = HEADINGS.get(c, c) + (" v" if c == view.sort else "")
        table.add_column(heading, justify="left" if c in ("engine", "health") else "right")
    for row in view.rows:
        cells = _cells(row)
        table.add_row(*(Text(cells[c], style=_style(row, c)) for c in COLUMNS))
    lines.append(table)
    shown = f"{len(view.rows)} of {view.engines_total} engines"
    lines.append(
        Text(
            f"s sort: {view.sort}   m model: {view.model or 'all'} ({shown})   q quit"
            f"   every {interval:g}s",
            style="dim",
        )
    )
    return Group(*lines)


@dataclass(slots=True)
class Choice:
    """What the keys chose: the sort column and the model shown."""

    sort: str = "engine"
    model: str | None = None


@contextlib.contextmanager
def keys(on_key: Callable[[str], None]) -> Iterator[None]:
    """Single keys from the terminal, without Enter, while the block runs (none without one)."""
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()
    tty.setcbreak(fd)

    def readable() -> None:
        for ch in os.read(fd, 64).decode("utf-8", "ignore"):
            on_key(ch)

    loop.add_reader(fd, readable)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def watch(urls: list[str], token: str | None, interval: float) -> None:
    """Refresh and draw until ``q``."""
    choice = Choice()
    done = asyncio.Event()
    previous: list[RouterSample] = []
    current: list[RouterSample] = []
    console = Console()
    timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_SECONDS)
    with Live(console=console, screen=True, auto_refresh=False) as live:

        def draw() -> None:
            view = fleet_view(current, previous, sort=choice.sort, model=choice.model)
            live.update(render(view, interval), refresh=True)

        def on_key(ch: str) -> None:
            if ch in "qQ":
                done.set()
                return
            if ch in "sS":
                choice.sort = next_of(SORTS, choice.sort)
            elif ch in "mM":
                models = sorted({m for r in current for m in r.models})
                choice.model = next_of([None, *models], choice.model)
            else:
                return
            draw()

        async with aiohttp.ClientSession(timeout=timeout) as http:
            with keys(on_key):
                while not done.is_set():
                    now = time.monotonic()
                    fresh = await asyncio.gather(*(read_router(http, u, token, now) for u in urls))
                    previous, current = current, list(fresh)
                    draw()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), interval)


def run(args: argparse.Namespace) -> int:
    urls = [u.rstrip("/") for u in args.urls]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        print(f"error: not an http(s) URL: {bad[0]}", file=sys.stderr)
        return 2
    if args.interval < MIN_INTERVAL_SECONDS:
        print(f"error: --interval must be at least {MIN_INTERVAL_SECONDS:g}s", file=sys.stderr)
        return 2
    token = os.environ.get(args.admin_token_env) or None
    try:
        asyncio.run(watch(urls, token, args.interval))
    except KeyboardInterrupt:
        return 130
    return 0
