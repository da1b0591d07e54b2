"""Dynamic batching: concurrent requests merged along axis 0, run once, split back.

Requests whose inputs have the same names, dtypes and trailing shapes can share a batch.
The first request waiting opens a batch; it closes as soon as its rows reach
``max_batch_size`` or one of the preferred sizes, or when ``max_queue_delay`` has passed
since that request arrived. Each caller then gets exactly its own rows back: the
rows ``[start, start + n)`` of every output, where ``start`` is its offset in the batch.

The queue policy (Triton's ``default_queue_policy``): a request that has waited longer than
its timeout is rejected (503) when a batch is gathered, or runs anyway when late requests are
not rejected (``DELAY``); with ``max_queue_size`` requests waiting, a new one is refused (503).

Batching only where it pays: merging saves compute where a model's run costs more than the
work of concatenating and splitting, and on some models and machines it does not. So the
batcher measures both ways in turn: the time per request of the runs it forms when it
batches (concatenate, run and split, over the sizes it actually forms, one-request batches
included), and of requests run alone as they arrive. When batching does not cut the cost per
request by at least ``MIN_SAVING`` (:func:`batching_pays`), the batcher steps aside: requests
run straight away, with no queue delay. Every ``HOLD`` requests it measures the other way
again for ``PROBE`` runs, so a change of load or model is noticed; each change of course
is logged once at INFO with the numbers that decided it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable
from types import EllipsisType
from typing import Any

import numpy as np

from xdevice._errors import InferenceError, message
from xdevice.serving.metrics import Stats
from xdevice.serving.protocol import BadRequest

__all__ = ["Batcher", "batching_pays", "cost_per_request"]

Arrays = dict[str, np.ndarray]
logger = logging.getLogger("xdevice.serving")

MIN_SAVING = 0.1  # batching must cut the cost per request by 10% to be worth its queue delay
PROBE = 32  # runs measured the other way before deciding again (the newest PROBE count)
HOLD = 2000  # requests served the chosen way before the other is measured again


def cost_per_request(runs: Iterable[tuple[float, int]]) -> float:
    """The median seconds per request of ``runs``, each ``(seconds, requests)``, every request
    of a run counted once (a merged run of 8 weighs as much as 8 runs of one).

    >>> cost_per_request([(0.004, 8), (0.001, 1)])  # 0.5 ms for each of 8 requests, 1 ms for one
    0.0005
    """
    weighted = [seconds / requests for seconds, requests in runs for _ in range(requests)]
    return statistics.median(weighted) if weighted else float("nan")


def batching_pays(single: float, merged: float, batching: bool = True, min_saving: float = MIN_SAVING) -> bool:
    """Whether merging is worth it: runs as merged cost at most ``1 - min_saving`` of runs of
    one request alone, per request (seconds; NaN, not measured yet, counts as paying, so the
    configuration is followed until measured). Once stepped aside (``batching`` False), coming
    back takes twice the saving, so costs within noise of each other do not flip it back and forth.

    >>> batching_pays(single=0.0010, merged=0.0004)  # 2.5x cheaper merged: batch
    True
    >>> batching_pays(single=0.0010, merged=0.00095)  # 5% cheaper: not worth the queue delay
    False
    >>> batching_pays(single=0.0010, merged=0.00085, batching=False)  # 15%: not enough to come back
    False
    """
    if single != single or merged != merged:  # NaN: one way is not measured yet
        return True
    return merged <= (1 - (min_saving if batching else 2 * min_saving)) * single


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
    while another runs; ``run`` executes in ``executor``, off the event loop. With
    ``measure`` (the default) the batcher steps aside while batching does not pay (see the
    module's docstring); ``name`` names the model in that log line. ``clock`` times the runs
    it compares: the thread's CPU time (the default) where ``run`` computes in the calling
    thread alone (ONNX Runtime on the CPU at one intra-op thread), so waiting for a core or
    the GIL is not counted; wall time (``time.perf_counter``) where other threads or a device
    do the work.
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
        measure: bool = True,
        name: str = "",
        clock: Callable[[], float] = time.thread_time,
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
        self.measure, self.name, self.clock = measure, name, clock
        # how requests go now, "merged" (queued, batched) or "single" (run as they arrive):
        # PROBE runs as configured, PROBE runs alone, a decision, HOLD requests that way,
        # PROBE runs the other way, a decision ... (see _measured)
        self.way, self.left, self.deciding, self.holding = "merged", PROBE, False, False
        self.batching = True  # the last decision
        #: seconds the recent runs alone took (smoothed wall time; inf until the first)
        self.recent = math.inf
        self.runs: dict[str, collections.deque[tuple[float, int]]] = {
            way: collections.deque(maxlen=PROBE) for way in ("merged", "single")
        }

    async def submit(self, inputs: Arrays, timeout: float | EllipsisType | None = ..., inline: bool = False) -> Arrays:
        """The outputs for one request's ``inputs``, computed in a shared batch; ``timeout``:
        seconds it may wait in the queue (default: the batcher's; None: no limit). ``inline``:
        while stepped aside, run on the calling thread (the event loop) rather than in
        ``executor`` (the caller's choice: a lone request on a fast model, see ``recent``)."""
        loop = asyncio.get_running_loop()
        if not self.workers:
            self.wakeup, self.gathering = asyncio.Event(), asyncio.Lock()
            self.workers = [loop.create_task(self._work()) for _ in range(self.instances)]
        if self.measure and self.way == "single":
            return await self._alone(inputs, inline)
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

    async def _alone(self, inputs: Arrays, inline: bool = False) -> Arrays:
        """Run one request's ``inputs`` as it arrives, with no queue delay (stepped aside):
        in ``executor``, or here where ``inline``."""
        arrived = time.perf_counter()
        if inline:
            outputs, started, seconds = self._timed(inputs)
        else:
            running = asyncio.get_running_loop().run_in_executor(self.executor, self._timed, inputs)
            outputs, started, seconds = await running
        took = time.perf_counter() - started
        self.stats.queued(started - arrived)
        self.stats.executed(next(iter(inputs.values())).shape[0], took)
        self.recent = took if self.recent == math.inf else 0.8 * self.recent + 0.2 * took
        self._measured("single", seconds, 1)
        return outputs

    def _timed(self, inputs: Arrays) -> tuple[Arrays, float, float]:
        """``run(inputs)`` in an instance's thread: (outputs, when it started, its cost by
        ``clock``)."""
        started, cpu = time.perf_counter(), self.clock()
        outputs = self.run(inputs)
        return outputs, started, self.clock() - cpu

    def _measured(self, way: str, seconds: float, requests: int) -> None:
        """Count a run made ``way`` (``seconds`` for ``requests`` requests); once the current
        way has served its share (``PROBE`` runs measuring, ``HOLD`` requests once decided),
        switch: a probe of the other way ends in a decision."""
        if not self.measure:
            return
        self.runs[way].append((seconds, requests))
        if way != self.way:
            return
        self.left -= requests if self.holding else 1  # HOLD counts requests, PROBE runs
        if self.left > 0:
            return
        if not self.deciding:  # measure the other way for a while
            self.way = "single" if self.way == "merged" else "merged"
            self.left, self.deciding, self.holding = PROBE, True, False
            return
        single, merged = cost_per_request(self.runs["single"]), cost_per_request(self.runs["merged"])
        pays = batching_pays(single, merged, self.batching)
        logger.debug("%s: %.3f ms per request merged, %.3f ms alone", self.name or "model", merged * 1e3, single * 1e3)
        if pays != self.batching:
            sizes = [requests for _, requests in self.runs["merged"]]
            logger.info(
                "%s: dynamic batching %s: %.3f ms per request in merged runs (mean %.1f requests a run) "
                "against %.3f ms run alone%s; measured again every %d requests",
                self.name or "model",
                "pays, batching again" if pays else "does not pay here, stepping aside",
                merged * 1e3,
                sum(sizes) / len(sizes),
                single * 1e3,
                "" if pays else f" (to resume, {2 * MIN_SAVING:.0%} less); requests now run as they arrive",
                HOLD,
            )
        self.batching = pays
        self.way, self.left, self.deciding, self.holding = ("merged" if pays else "single"), HOLD, False, True

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
            start, cpu = time.perf_counter(), self.clock()
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
                merging = self.clock() - cpu
                running = loop.run_in_executor(self.executor, self._timed, merged)
                try:
                    outputs, _, seconds = await asyncio.shield(running)
                except asyncio.CancelledError:  # closing: this batch still reaches its callers
                    _split(batch, (await running)[0])
                    raise
                self.stats.executed(sum(item.rows for item in batch), time.perf_counter() - start, len(batch))
                cpu = self.clock()
                _split(batch, outputs)
                self._measured("merged", merging + seconds + self.clock() - cpu, len(batch))
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
