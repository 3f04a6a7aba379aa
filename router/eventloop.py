"""The event loop every kvrouter server runs on: uvloop where it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop factory when importable (faster I/O), else the standard one."""
    try:
        import uvloop  # optional: absent on platforms it does not support
    except ImportError:
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
