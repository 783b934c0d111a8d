"""Group commit: many callers' small requests answered by one statement.

A caller asks for one key and awaits its answer. If no batch is being run,
one starts on the loop's next turn with every request made in the meantime;
requests made while it runs form the next batch. Nothing waits on a timer, so
a lone request costs what it did before, and a burst of a thousand costs a
few round trips instead of a thousand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class Coalescer(Generic[K, R]):
    """Answers ``await coalescer(key)`` by calling ``run(keys)`` for batches of keys.

    ``run`` returns one result per key; if it raises, every caller of that batch
    gets the exception.
    """

    def __init__(
        self, run: Callable[[Sequence[K]], Awaitable[dict[K, R]]], max_batch: int = 500
    ) -> None:
        self._run = run
        self._max_batch = max_batch
        self._pending: list[tuple[K, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, key: K) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((key, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        batch: list[tuple[K, asyncio.Future[R]]] = []
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                try:
                    results = await self._run([key for key, _ in batch])
                except Exception as exc:  # every caller of the batch sees it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for key, future in batch:
                    if future.done():
                        continue
                    if key in results:
                        future.set_result(results[key])
                    else:
                        future.set_exception(LookupError(f"no result for {key!r}"))
        finally:
            self._flusher = None
            # Cancelled mid-batch (shutdown): nobody is left waiting forever.
            for _, future in [*batch, *self._pending]:
                if not future.done():
                    future.cancel()
