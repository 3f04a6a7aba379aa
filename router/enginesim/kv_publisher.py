"""engine-sim's KV cache events, published the way vLLM publishes them.

``CacheEvents`` (pure) watches the prefix cache's admissions through a mirror with the cache's
own capacity and eviction rule (``core.lru``, touched the same way), so it knows exactly which
blocks each request stored and which it evicted, and writes them as vLLM's events: a batch
``[ts, events, data_parallel_rank]`` of ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``, each event a tagged array (vLLM before 0.24) or a map with a ``type``
(0.24 onwards), block hashes as uint64 integers or as 32 bytes. The block hash is the cache's
own key (its bytes form a sha256 of it); the token ids are ``tokens.token_ids``.

``Publisher`` (I/O) sends each batch on a ZMQ PUB socket as ``[topic, seq, payload]``, keeps
the last ``REPLAY_BATCHES`` batches, and answers replay requests on a ROUTER socket: a
DEALER's ``[b"", start_seq]`` gets one ``[b"", topic, seq, payload]`` per buffered batch from
``start_seq`` on, then the end marker ``[b"", b"", -1, b""]`` (vLLM 0.26's framing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack  # type: ignore[import-untyped]  # ships no type information
import zmq
import zmq.asyncio

from router.core.lru import lru_keys

log = logging.getLogger(__name__)

Encoding = Literal["array", "map"]
HashKind = Literal["int", "bytes"]
ENCODINGS: tuple[Encoding, ...] = ("array", "map")
HASH_KINDS: tuple[HashKind, ...] = ("int", "bytes")
# vLLM keeps 10,000 batches for replay by default; engine-sim's batches are one request each.
REPLAY_BATCHES = 10_000
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# A subscriber that lags this far behind loses messages (vLLM's default high-water mark).
SEND_HWM = 100_000


# Fields without a default in vLLM's event structs: present even when nil.
REQUIRED = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size")}


@dataclass(frozen=True, slots=True)
class EventSettings:
    """Where and how engine-sim publishes its KV cache events."""

    port: int
    replay_port: int | None = None
    topic: str = ""
    encoding: Encoding = "map"
    hashes: HashKind = "int"
    host: str = "127.0.0.1"


class CacheEvents:
    """Admissions and resets of the prefix cache -> vLLM-shaped event payloads (no I/O)."""

    def __init__(
        self, capacity_blocks: int, block_tokens: int, encoding: Encoding, hashes: HashKind
    ):
        self._mirror = lru_keys(max(1, capacity_blocks))
        self.block_tokens = block_tokens
        self.encoding = encoding
        self.hashes = hashes

    def _hash(self, key: int) -> int | bytes:
        if self.hashes == "int":
            return key
        return hashlib.sha256(key.to_bytes(8, "big")).digest()

    def _event(self, tag: str, fields: Sequence[tuple[str, Any]]) -> Any:
        if self.encoding == "array":
            # Positional; trailing fields holding their default (nil) are dropped.
            values = [v for _, v in fields]
            while values and values[-1] is None:
                values.pop()
            return [tag, *values]
        # Fields with a default are omitted when they hold it; required ones always go out.
        required = REQUIRED.get(tag, ())
        return {"type": tag, **{k: v for k, v in fields if v is not None or k in required}}

    def admitted(
        self, keys: Sequence[int], token_ids: Callable[[int, int], Sequence[int]], now: float
    ) -> list[Any]:
        """The events of a prompt whose full blocks are ``keys`` entering the cache;
        ``token_ids(start, end)`` gives its ids from ``start`` to ``end`` (only the blocks
        stored are asked for, as an engine sends only those)."""
        held = self._mirror.keys()
        new = [i for i, k in enumerate(keys) if k not in held]
        evicted = self._mirror.touch_chain(keys, now)
        events: list[Any] = []
        if evicted:
            hashes = [self._hash(k) for k in evicted]
            events.append(
                self._event("BlockRemoved", [("block_hashes", hashes), ("medium", "GPU")])
            )
        if new:
            # New blocks of one prompt follow its cached head: one run from the first new one.
            first = new[0]
            bt = self.block_tokens
            run = list(range(first, len(keys)))
            tokens = list(token_ids(first * bt, len(keys) * bt))
            parent = self._hash(keys[first - 1]) if first else None
            fields = [
                ("block_hashes", [self._hash(keys[i]) for i in run]),
                ("parent_block_hash", parent),
                ("token_ids", tokens),
                ("block_size", bt),
                ("lora_id", None),
                ("medium", "GPU"),
            ]
            events.append(self._event("BlockStored", fields))
        return events

    def cleared(self) -> list[Any]:
        """The events of the cache emptied."""
        self._mirror.clear()
        return [self._event("AllBlocksCleared", [])]

    @staticmethod
    def batch(events: list[Any], ts: float) -> bytes:
        return bytes(msgpack.packb([ts, events, 0], use_bin_type=True))


class Publisher:
    """A ZMQ PUB socket for batches, a replay buffer, and a ROUTER socket answering replays."""

    def __init__(self, settings: EventSettings) -> None:
        self.settings = settings
        self.topic = settings.topic.encode()
        # The PUB socket is used synchronously (it never blocks); replays run on the loop.
        self._pub_ctx = zmq.Context()
        self._ctx = zmq.asyncio.Context()
        self._pub = self._pub_ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._router: zmq.asyncio.Socket | None = None
        if settings.replay_port is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self._task: asyncio.Task[None] | None = None

    def publish(self, events: list[Any]) -> None:
        """Send one batch now (dropped for subscribers past the high-water mark)."""
        if not events:
            return
        payload = CacheEvents.batch(events, time.time())
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            # A PUB socket never blocks: past the high-water mark it drops, as engines do.
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)

    async def _replays(self) -> None:
        sock = self._router
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not [identity, b"", start_seq]
            ident, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart(
                        [ident, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
            await sock.send_multipart([ident, b"", b"", END_SEQ, b""])

    def start(self) -> None:
        """Bind the sockets and answer replays (inside a running event loop)."""
        s = self.settings
        self._pub.bind(f"tcp://{s.host}:{s.port}")
        if self._router is not None:
            self._router.bind(f"tcp://{s.host}:{s.replay_port}")
            self._task = asyncio.create_task(self._replays(), name="kv-events-replay")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(0)
        if self._router is not None:
            self._router.close(0)
        self._ctx.term()
        self._pub_ctx.term()
