"""Dynamic batching: concurrent requests merged along axis 0, run once, split back.

Requests whose inputs have the same names, dtypes and trailing shapes can share a batch.
The first request waiting opens a batch; it closes as soon as its rows reach
``max_batch_size`` or one of the preferred sizes, or when ``max_queue_delay`` has passed
since that request arrived. Each caller then gets exactly its own rows back: the
rows ``[start, start + n)`` of every output, where ``start`` is its offset in the batch.

The queue policy (Triton's ``default_queue_policy``): a request that has waited longer than
its timeout is rejected (503) when a batch is gathered, or runs anyway when late requests are
not rejected (``DELAY``); with ``max_queue_size`` requests waiting, a new one is refused (503).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable
from types import EllipsisType
from typing import Any

import numpy as np

from xdevice._errors import InferenceError, message
from xdevice.serving.metrics import Stats
from xdevice.serving.protocol import BadRequest

__all__ = ["Batcher"]

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(eq=False)  # compared by identity: the queue removes exactly this one
class _Pending:
    inputs: Arrays
    rows: int
    key: tuple
    arrived: float
    done: asyncio.Future
    deadline: float | None  # when it stops being worth running (None: never)


class Batcher:
    """Queue requests for ``run`` (a blocking function of a dict of arrays) and batch them.

    ``instances`` workers take batches from one queue, so one batch can be gathered
    while another runs; ``run`` executes in ``executor``, off the event loop.
    """

    def __init__(
        self,
        run: Callable[[Arrays], Arrays],
        *,
        max_batch_size: int,
        max_queue_delay: float,
        executor: Any,
        stats: Stats,
        instances: int = 1,
        preferred: tuple[int, ...] = (),
        timeout: float = 0.0,
        reject_late: bool = True,
        max_queue_size: int = 0,
    ):
        self.run, self.max_batch_size, self.delay = run, max_batch_size, max_queue_delay
        self.preferred = set(preferred)
        self.executor, self.stats, self.instances = executor, stats, instances
        self.timeout, self.reject_late, self.max_queue_size = timeout or None, reject_late, max_queue_size
        self.queue: collections.deque[_Pending] = collections.deque()
        # made by the first submit, in the event loop that serves the model
        self.wakeup: asyncio.Event
        self.gathering: asyncio.Lock
        self.workers: list[asyncio.Task] = []

    async def submit(self, inputs: Arrays, timeout: float | EllipsisType | None = ...) -> Arrays:
        """The outputs for one request's ``inputs``, computed in a shared batch; ``timeout``:
        seconds it may wait in the queue (default: the batcher's; None: no limit)."""
        loop = asyncio.get_running_loop()
        if not self.workers:
            self.wakeup, self.gathering = asyncio.Event(), asyncio.Lock()
            self.workers = [loop.create_task(self._work()) for _ in range(self.instances)]
        if self.max_queue_size and len(self.queue) >= self.max_queue_size:
            raise BadRequest(
                message(
                    "The model's queue is full",
                    expected=f"at most {self.max_queue_size} requests waiting (max_queue_size)",
                    received=len(self.queue),
                    fix="send again shortly",
                ),
                status=503,
            )
        key = tuple(sorted((name, x.dtype.str, x.shape[1:]) for name, x in inputs.items()))
        rows = next(iter(inputs.values())).shape[0]
        now = time.perf_counter()
        timeout = self.timeout if timeout is ... else timeout
        pending = _Pending(inputs, rows, key, now, loop.create_future(), None if timeout is None else now + timeout)
        self.queue.append(pending)
        self.stats.waiting(+1)
        self.wakeup.set()
        return await pending.done

    async def close(self) -> None:
        """Stop: batches already running finish for their callers; requests still queued fail."""
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.workers = []
        while self.queue:
            item = self.queue.popleft()
            self.stats.waiting(-1)
            if not item.done.done():
                item.done.set_exception(
                    InferenceError(
                        "The model was unloaded while this request waited in its queue. Fix: send it again "
                        "once the model is loaded (GET /v2/models/<name>/ready)."
                    )
                )

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            async with self.gathering:  # one worker gathers at a time; the others run batches
                while not self.queue:
                    self.wakeup.clear()
                    await self.wakeup.wait()
                batch = await self._gather()
            if not batch:
                continue
            start = time.perf_counter()
            for item in batch:
                self.stats.waiting(-1)
                self.stats.queued(start - item.arrived)
            try:
                merged = {
                    name: np.concatenate([item.inputs[name] for item in batch])
                    if len(batch) > 1
                    else batch[0].inputs[name]
                    for name in batch[0].inputs
                }
                running = loop.run_in_executor(self.executor, self.run, merged)
                try:
                    outputs = await asyncio.shield(running)
                except asyncio.CancelledError:  # closing: this batch still reaches its callers
                    _split(batch, await running)
                    raise
                self.stats.executed(sum(item.rows for item in batch), time.perf_counter() - start, len(batch))
                _split(batch, outputs)
            except Exception as error:  # noqa: BLE001 - every caller of the batch hears of it
                for item in batch:
                    if not item.done.done():
                        item.done.set_exception(error)

    async def _gather(self) -> list[_Pending]:
        """The oldest request and the compatible ones that fit, once the batch should close
        (late requests are rejected first, when the policy says so)."""
        while True:
            if self.reject_late:
                self._reject_late()
            if not self.queue:
                return []
            first = self.queue[0]
            deadline = first.arrived + self.delay
            batch, rows = [], 0
            for item in self.queue:
                if item.key == first.key and rows + item.rows <= self.max_batch_size:
                    batch.append(item)
                    rows += item.rows
            if rows >= self.max_batch_size or rows in self.preferred or time.perf_counter() >= deadline:
                break
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), timeout=max(deadline - time.perf_counter(), 0))
            except asyncio.TimeoutError:
                pass
        for item in batch:
            self.queue.remove(item)
        return batch

    def _reject_late(self) -> None:
        now = time.perf_counter()
        for item in [item for item in self.queue if item.deadline is not None and now > item.deadline]:
            self.queue.remove(item)
            self.stats.waiting(-1)
            if not item.done.done():
                item.done.set_exception(
                    BadRequest(
                        message(
                            "The request waited in the queue past its timeout",
                            received=f"{now - item.arrived:.3f} s",
                            fix="send it again, or raise default_timeout_microseconds",
                        ),
                        status=503,
                    )
                )


def _split(batch: list[_Pending], outputs: Arrays) -> None:
    total = sum(item.rows for item in batch)
    for name, value in outputs.items():
        if len(batch) > 1 and (value.ndim == 0 or value.shape[0] != total):
            raise InferenceError(_not_batchable(name, value.shape, total))
    start = 0
    for item in batch:
        stop = start + item.rows
        if not item.done.done():
            item.done.set_result(
                {name: value[start:stop] if len(batch) > 1 else value for name, value in outputs.items()}
            )
        start = stop


def _not_batchable(name: str, shape: tuple, rows: int) -> str:
    return (
        f"Output {name!r} has shape {list(shape)}, not {rows} rows first: this model cannot be "
        f"batched dynamically. Fix: remove `dynamic_batching` from its config.pbtxt."
    )
