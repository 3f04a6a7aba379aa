"""What an engine-sim app holds, under typed keys: the state its route modules share.

``router.enginesim.app`` builds and fills them; its routes and those of
``router.enginesim.faults`` read them from ``request.app``.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry

from router.enginesim.cancel import Runs
from router.enginesim.disagg import Disagg
from router.enginesim.engine import Engine
from router.enginesim.kv_publisher import CacheEvents, Publisher
from router.enginesim.stored import ResponseStore

ENGINE = web.AppKey("engine", Engine)
RUNS = web.AppKey("runs", Runs)
REGISTRY = web.AppKey("registry", CollectorRegistry)
EVENTS = web.AppKey("events", CacheEvents)
PUBLISHER = web.AppKey("publisher", Publisher)
STORE = web.AppKey("store", ResponseStore)
DISAGG = web.AppKey("disagg", Disagg)
