"""The engine thread's updates handed to the asyncio loop, one wake-up for many.

``loop.call_soon_threadsafe`` per update writes to the loop's self-pipe once per token of every
request: a syscall that releases the interpreter lock, after which the engine thread waits to
get it back from the asyncio thread, R times a step. An :class:`Outbox` queues the updates;
the engine thread calls :meth:`~Outbox.flush` once a pass, which wakes the loop once to drain every
update queued by then. Updates keep their order (one list, appended and drained under one lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


class Outbox:
    """Puts items on asyncio queues from any thread; :meth:`bind` it to the loop first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue[Any], Any]] = []
        self._armed = False  # NOTE: a drain is scheduled and has not taken the items yet
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver on ``loop`` (the server's, once it runs)."""
        self._loop = loop

    def put(self, queue: asyncio.Queue[Any], item: Any) -> None:
        """``queue.put_nowait(item)`` on the bound loop at the next :meth:`flush`."""
        with self._lock:
            self._items.append((queue, item))

    def flush(self) -> None:
        """Wake the loop to deliver what is queued (a no-op when nothing is, or a wake-up is
        pending); dropped once the loop has closed (nobody is waiting then)."""
        with self._lock:
            if self._armed or not self._items:
                return
            self._armed = True
        assert self._loop is not None, "Outbox.flush before bind"
        with contextlib.suppress(RuntimeError):  # NOTE: a closed loop (shutdown)
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._armed = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)
