"""Dynamic batching: concurrent requests merged along axis 0, run once, split back.

Requests whose inputs have the same names, dtypes and trailing shapes can share a batch.
The first request waiting opens a batch; it closes as soon as its rows reach
``max_batch_size`` or one of the preferred sizes, or when ``max_queue_delay`` has passed
since that request arrived. Each caller then gets exactly its own rows back: the
rows ``[start, start + n)`` of every output, where ``start`` is its offset in the batch.

The queue policy (Triton's ``default_queue_policy``): a request that has waited longer than
its timeout is rejected (503) when a batch is gathered, or runs anyway when late requests are
not rejected (``DELAY``); with ``max_queue_size`` requests waiting, a new one is refused (503).

Batching only where it pays, end to end. A merged run saves model compute, but what a
request costs the server is mostly the protocol work around the run (reading, decoding,
encoding, writing), and on a small model or a busy machine merging can save nothing a
client would see, or cost more than it saves, while every request waits for company. So the
batcher measures the one number a client sees, the rate requests are answered, both ways
in turn (:class:`Course`): short phases (at least ``PHASE`` seconds and ``PHASE_ANSWERS``
answers) of merged runs and of requests run alone as they arrive, alternated for ``ROUNDS``
rounds. Batching is kept where its runs answer at least ``MIN_GAIN`` more requests a second
than the runs alone in the same rounds (:func:`choose`); otherwise the batcher steps aside:
requests run as they arrive, with no queue delay, as on a model without batching. A tie
goes to running alone, so that the batcher never serves fewer requests than the model would
without it: short phases measure a rate to within a few percent, and a model whose merged
runs save that little (the zoo cnn here, 1.1x of its compute at batch 32) can land on either
side of its plain rate from one run to the next. Where ``LONE_RUNS`` merged runs held one
request each (no company comes within the delay: a lone client), it steps aside at once,
without measuring the rest. A decision holds for ``HOLD_REQUESTS`` requests at least, then
until ``HOLD`` seconds have passed since it or the load pauses for ``IDLE`` seconds (a new
load may differ); then both ways are measured again. Each change of course is logged once
at INFO with the numbers that decided it.

A fast model's merged runs (under ``inline_below``, see :class:`Batcher`) run on the event
loop rather than an instance thread, as its lone requests do.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import Any

import numpy as np

from xdevice._errors import InferenceError, message
from xdevice.serving.metrics import Stats
from xdevice.serving.protocol import BadRequest

__all__ = ["Batcher", "Course", "WAYS", "choose"]

Arrays = dict[str, np.ndarray]
logger = logging.getLogger("xdevice.serving")

MIN_GAIN = 0.05  # merged runs must answer 5% more requests a second than runs alone to be kept
MIN_BATCH = 1.1  # requests a merged run must hold on average: with fewer, merging only adds the delay
PHASE = 0.05  # seconds a measuring phase lasts at least ...
PHASE_ANSWERS = 32  # ... and requests of its own it answers at least
ROUNDS = 6  # rounds of phases (merged, then alone) compared for one decision
LONE_RUNS = 16  # merged runs that, holding one request each, end the measure at once (no company)
HOLD_REQUESTS = 1000  # requests a decision holds for at least; then it is measured again ...
HOLD = 30.0  # ... once this many seconds have passed since it ...
IDLE = 1.0  # ... or after a pause of the load this long (nothing in flight): a new load may differ

#: the ways requests can go: merged runs, or each request alone as it arrives (stepped aside)
WAYS = ("merged", "single")


def choose(rounds: Sequence[dict[str, float]], batch: float = math.inf) -> str:
    """The way requests should go, ``"merged"`` or ``"single"``, from ``rounds`` of measured
    phases (each: way -> requests a second answered, the ways measured one after the other)
    and ``batch``, the mean requests a merged run held.

    Batching is kept where its runs answer at least ``MIN_GAIN`` more requests than runs
    alone in the same rounds (the median of the rounds' ratios) and held at least
    ``MIN_BATCH`` requests on average (with fewer, merging only adds the queue delay). Ratios
    within rounds, not all phases pooled, so a load that changes while measuring moves both
    sides of a ratio alike.

    >>> choose([{"merged": 6000, "single": 5000}, {"merged": 6400, "single": 5300}])  # 1.2x
    'merged'
    >>> choose([{"merged": 3300, "single": 3400}, {"merged": 3350, "single": 3300}])  # level: alone
    'single'
    >>> choose([{"merged": 2000, "single": 3000}, {"merged": 2100, "single": 3100}])  # merging costs more
    'single'
    >>> choose([], batch=1.0)  # no company came
    'single'
    """
    if batch < MIN_BATCH:
        return "single"
    if not rounds:
        return "merged"
    return "merged" if _median([r["merged"] / r["single"] for r in rounds]) >= 1 + MIN_GAIN else "single"


class Course:
    """Which way requests go (:data:`WAYS`: merged, or alone as they arrive), chosen by
    measuring both in turn (see the module's docstring).

    A state machine over the times it is given, so it is tested with given times: each
    request is counted in the phase it arrived in (:meth:`arrived` returns it) and reported
    back once answered or failed (:meth:`done`). A phase's rate is its own requests answered
    from its first answer to its last, that first answer taken once the requests of the way
    before, still in flight when the way changed, are all answered: they count for neither.

    >>> course = Course()
    >>> course.way, course.measuring  # the configuration is followed until measured
    ('merged', True)
    """

    def __init__(self, name: str = "model"):
        self.name, self.ways = name, WAYS
        self.way = "merged"  # how requests go now
        self.chosen = "merged"  # the last decision (the configuration until measured)
        self.measuring = True
        self.phase = 0  # the current phase's number: each request is counted in the one it arrived in
        self.rates: list[tuple[str, float]] = []  # (way, requests a second) of the phases measured, in order
        self.runs = self.batched = 0  # merged runs while measuring, and their requests
        self.in_flight = 0
        self.last = -math.inf  # when a request last arrived or was answered
        self.paused = False  # the load stopped (IDLE) since the decision
        self.decided = -math.inf  # when the decision was made
        self.served = 0  # requests that arrived since
        self._open_phase()

    @property
    def batching(self) -> bool:
        """Whether requests are merged now."""
        return self.way != "single"

    def _open_phase(self) -> None:
        self.first: float | None = None  # the phase's first answer: its clock starts there
        self.counted = 0  # its own requests answered after the first answer
        # requests of the ways before, still in flight: the clock waits until they are all
        # answered (they take the server's time at the start of this phase: counted in it,
        # they would make the way after a merged phase look slower than it is)
        self.stale = self.in_flight

    def arrived(self, now: float) -> int:
        """A request arrives at ``now`` (seconds): the phase it is counted in. It goes
        :attr:`way` (read it after this call: a hold that ends measures again)."""
        if self.in_flight == 0 and now - self.last >= IDLE:  # the load stopped: what comes is new
            if self.measuring:
                self._open_phase()  # the pause is no way's time
            else:
                self.paused = True
        if not self.measuring:
            self.served += 1
            if self.served >= HOLD_REQUESTS and (self.paused or now - self.decided >= HOLD):
                self.measuring, self.rates, self.runs, self.batched = True, [], 0, 0
                self.phase += 1
                self._open_phase()
        self.in_flight += 1
        self.last = now
        return self.phase

    def done(self, now: float, phases: Sequence[int], answered: bool = True) -> None:
        """Requests that arrived in ``phases`` were answered together at ``now`` (one run), or
        failed or were refused (``answered`` False: they leave, uncounted)."""
        self.in_flight -= len(phases)
        self.last = now
        mine = list(phases).count(self.phase)
        self.stale = max(self.stale - (len(phases) - mine), 0)
        own = mine if self.measuring and answered else 0
        if not own:
            return
        if self.batching:
            self.runs, self.batched = self.runs + 1, self.batched + own
            if self.runs >= LONE_RUNS and self.batched < MIN_BATCH * self.runs:  # no company comes
                self._decide(now)
                return
        if self.first is None:
            if not self.stale:
                self.first = now
            return
        self.counted += own
        if self.counted >= PHASE_ANSWERS and now - self.first >= PHASE:
            self.rates.append((self.way, self.counted / (now - self.first)))
            if len(self.rates) >= ROUNDS * len(self.ways):
                self._decide(now)
                return
            self.way = self.ways[(self.ways.index(self.way) + 1) % len(self.ways)]
            self.phase += 1
            self._open_phase()

    def rounds(self) -> list[dict[str, float]]:
        """The rates measured so far, a round (one phase of each way) at a time."""
        n = len(self.ways)
        return [dict(self.rates[i : i + n]) for i in range(0, len(self.rates) - n + 1, n)]

    def _decide(self, now: float) -> None:
        rounds, batch = self.rounds(), self.batched / self.runs if self.runs else math.inf
        way = choose(rounds, batch)
        if rounds:
            rates = {w: _median([r[w] for r in rounds]) for w in self.ways}
            numbers = (
                ", ".join(f"{rates[w]:.0f} requests/s {_SAYS[w]}" for w in self.ways)
                + f" (medians of {len(rounds)} rounds; merged runs held {batch:.1f} requests on average)"
            )
        else:
            numbers = f"merged runs held {batch:.2f} requests each: no company comes within the queue delay"
        logger.debug("%s: %s", self.name, numbers)
        if way != self.chosen:
            logger.info(
                "%s: dynamic batching %s: %s; measured again after %d requests and %.0f s or a pause",
                self.name,
                _DECIDED[way],
                numbers,
                HOLD_REQUESTS,
                HOLD,
            )
        self.settle(way, now)

    def settle(self, way: str, now: float) -> None:
        """Go ``way`` from ``now`` on, for a hold: what a decision does."""
        self.way, self.chosen, self.measuring = way, way, False
        self.decided, self.served, self.paused = now, 0, False
        self.phase += 1


_SAYS = {"merged": "merged", "single": "run alone"}
_DECIDED = {
    "merged": "pays, batching again",
    "single": "does not pay here, stepping aside (requests now run as they arrive)",
}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclasses.dataclass(eq=False)  # compared by identity: the queue removes exactly this one
class _Pending:
    inputs: Arrays
    rows: int
    key: tuple
    arrived: float
    done: asyncio.Future
    deadline: float | None  # when it stops being worth running (None: never)
    phase: int = 0  # the course's phase it arrived in


class Batcher:
    """Queue requests for ``run`` (a blocking function of a dict of arrays) and batch them.

    ``instances`` workers take batches from one queue, so one batch can be gathered
    while another runs; ``run`` executes in ``executor``, off the event loop. With
    ``measure`` (the default) the batcher steps aside while batching does not pay (see the
    module's docstring; :attr:`course` decides); ``name`` names the model in that log line.
    ``clock`` is the wall clock its phases are timed by. ``inline_below`` (seconds): a model
    whose merged runs take less runs them on the event loop itself, as a fast model's lone
    request does (``Models.infer``); 0, never. Handing such a run to a thread and back (two
    wake-ups, the GIL passed back and forth) costs the server more CPU than the run.
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
        clock: Callable[[], float] = time.perf_counter,
        inline_below: float = 0.0,
    ):
        self.run, self.max_batch_size, self.delay = run, max_batch_size, max_queue_delay
        self.preferred = set(preferred)
        self.executor, self.stats, self.instances = executor, stats, instances
        self.timeout, self.reject_late, self.max_queue_size = timeout or None, reject_late, max_queue_size
        self.queue: collections.deque[_Pending] = collections.deque()
        # made by the first submit, in the event loop that serves the model
        self.gathering: asyncio.Lock
        self.waiter: asyncio.Future | None = None  # the gathering worker's, while it waits for requests
        self.rows = 0  # rows waiting in the queue
        self.workers: list[asyncio.Task] = []
        self.clock = clock
        self.inline_below = inline_below
        #: which way requests go (None: always merged, as configured)
        self.course = Course(name or "model") if measure else None
        #: seconds the recent runs alone took (smoothed wall time; inf until the first)
        self.recent = math.inf
        #: seconds the recent merged runs took (smoothed wall time; inf until the first)
        self.merged_recent = math.inf

    async def submit(self, inputs: Arrays, timeout: float | EllipsisType | None = ..., inline: bool = False) -> Arrays:
        """The outputs for one request's ``inputs``, computed in a shared batch; ``timeout``:
        seconds it may wait in the queue (default: the batcher's; None: no limit). ``inline``:
        while stepped aside, run on the calling thread (the event loop) rather than in
        ``executor`` (the caller's choice: a lone request on a fast model, see ``recent``)."""
        loop = asyncio.get_running_loop()
        if not self.workers:
            self.gathering = asyncio.Lock()
            self.workers = [loop.create_task(self._work()) for _ in range(self.instances)]
        phase = 0
        if self.course is not None:
            phase = self.course.arrived(self.clock())
            if self.course.way == "single":
                return await self._alone(inputs, phase, inline)
        if self.max_queue_size and len(self.queue) >= self.max_queue_size:
            self._done([phase], answered=False)
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
        pending = _Pending(
            inputs, rows, key, now, loop.create_future(), None if timeout is None else now + timeout, phase
        )
        self.queue.append(pending)
        self.rows += rows
        self.stats.waiting(+1)
        # the gathering worker looks again only where this request can close a batch (or opens
        # one): waking it for each arrival costs the event loop more than the merged run saves
        if len(self.queue) == 1 or self.rows >= self.max_batch_size or self.preferred:
            self._wake()
        return await pending.done

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        """Until :meth:`_wake`, or ``timeout`` seconds (None: no limit)."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(max(timeout, 0.0), self._wake)
        try:
            await self.waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def _done(self, phases: list[int], answered: bool = True) -> None:
        if self.course is not None:
            self.course.done(self.clock(), phases, answered)

    async def _alone(self, inputs: Arrays, phase: int, inline: bool = False) -> Arrays:
        """Run one request's ``inputs`` as it arrives, with no queue delay (stepped aside):
        in ``executor``, or here where ``inline``."""
        arrived = time.perf_counter()
        answered = False
        try:
            if inline:
                outputs, started = self._timed(inputs)
            else:
                outputs, started = await asyncio.get_running_loop().run_in_executor(self.executor, self._timed, inputs)
            answered = True
        finally:
            self._done([phase], answered)
        took = time.perf_counter() - started
        self.stats.queued(started - arrived)
        self.stats.executed(next(iter(inputs.values())).shape[0], took)
        self.recent = took if self.recent == math.inf else 0.8 * self.recent + 0.2 * took
        return outputs

    def _timed(self, inputs: Arrays) -> tuple[Arrays, float]:
        """``run(inputs)`` in an instance's thread: (outputs, when it started)."""
        started = time.perf_counter()
        return self.run(inputs), started

    async def close(self) -> None:
        """Stop: batches already running finish for their callers; requests still queued fail."""
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)
        self.workers = []
        while self.queue:
            item = self.queue.popleft()
            self.rows -= item.rows
            self.stats.waiting(-1)
            self._done([item.phase], answered=False)
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
                    await self._wait(None)
                batch = await self._gather()
            if not batch:
                continue
            start = time.perf_counter()
            for item in batch:
                self.stats.waiting(-1)
                self.stats.queued(start - item.arrived)
            phases = [item.phase for item in batch]
            try:
                merged = {
                    name: np.concatenate([item.inputs[name] for item in batch])
                    if len(batch) > 1
                    else batch[0].inputs[name]
                    for name in batch[0].inputs
                }
                if self.merged_recent < self.inline_below:  # a fast model: on the event loop
                    outputs, started = self._timed(merged)
                else:
                    running = loop.run_in_executor(self.executor, self._timed, merged)
                    try:
                        outputs, started = await asyncio.shield(running)
                    except asyncio.CancelledError:  # closing: this batch still reaches its callers
                        _split(batch, (await running)[0])
                        raise
                took = time.perf_counter() - started
                self.merged_recent = took if self.merged_recent == math.inf else 0.8 * self.merged_recent + 0.2 * took
                self.stats.executed(sum(item.rows for item in batch), time.perf_counter() - start, len(batch))
                _split(batch, outputs)
                self._done(phases)
            except Exception as error:  # noqa: BLE001 - every caller of the batch hears of it
                self._done(phases, answered=False)
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
            await self._wait(deadline - time.perf_counter())
        for item in batch:
            self.queue.remove(item)
        self.rows -= rows
        return batch

    def _reject_late(self) -> None:
        now = time.perf_counter()
        for item in [item for item in self.queue if item.deadline is not None and now > item.deadline]:
            self.queue.remove(item)
            self.rows -= item.rows
            self.stats.waiting(-1)
            self._done([item.phase], answered=False)
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
