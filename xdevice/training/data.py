"""Batches for training: numpy arrays cut into seeded shuffled batches, or any iterable of
batches, and a prefetcher that places the next batch on the device while the current one
computes.

Shuffling is a function of ``(seed, epoch)`` only, so a resumed run sees the same batches.
The prefetcher is a background thread feeding a bounded queue; it counts the time the
training loop spent waiting for input, which is what ``History`` reports as
``input_wait`` (a fraction of the epoch's time). Placing is the backend's ``to_device``:
PyTorch copies a host batch bound for a CUDA device through pinned memory, without blocking
(``backends/torch/placement.py``), so the copy overlaps the step that is running. It steps
aside where it cannot help: batches cut from arrays in memory that are quicker to place
than a step is to run (see :class:`Prefetcher`).

>>> import numpy as np
>>> data = Batches(np.arange(10), np.arange(10), batch_size=4, seed=0)
>>> [len(x) for x, _ in data.epoch(0)]
[4, 4, 2]
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from xdevice._errors import ConfigurationError, message
from xdevice._seed import default_seed

__all__ = ["Batches", "Prefetcher", "as_batches"]


class Batches:
    """``(x, y)`` numpy arrays served as batches along axis 0, reshuffled each epoch.

    Args:
        x, y: arrays with the same first dimension (``y`` may be None).
        batch_size: rows per batch; the last batch may be smaller unless ``drop_last``.
        shuffle: a new order each epoch, drawn from ``(seed, epoch)``.
        seed: default: ``xdevice.seed``'s, else 0.
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        *,
        batch_size: int = 32,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = False,
    ):
        import numpy as np

        self.x, self.y = np.asarray(x), None if y is None else np.asarray(y)
        if self.y is not None and len(self.y) != len(self.x):
            raise ConfigurationError(
                message(
                    "x and y have different numbers of rows",
                    expected="the same first dimension",
                    received=f"x {len(self.x)}, y {len(self.y)}",
                )
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(message("batch_size must be a positive int", received=batch_size))
        seed = default_seed() if seed is None else seed
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last

    def __len__(self) -> int:
        full, rest = divmod(len(self.x), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Any, Any]]:
        """The batches of ``epoch``, from batch number ``start`` (to resume mid-epoch)."""
        return _Slices(self._slices(epoch, start))

    def _slices(self, epoch: int, start: int) -> Iterator[tuple[Any, Any]]:
        import numpy as np

        order = (
            np.random.default_rng([self.seed, epoch]).permutation(len(self.x))
            if self.shuffle
            else np.arange(len(self.x))
        )
        for index in range(start, len(self)):
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            yield self.x[rows], None if self.y is None else self.y[rows]


class _Slices(Iterator):
    """One epoch of :class:`Batches`: slices of arrays already in host memory, which the
    :class:`Prefetcher` recognises."""

    def __init__(self, slices: Iterator[tuple[Any, Any]]):
        self._slices = slices

    def __next__(self) -> tuple[Any, Any]:
        return next(self._slices)


class _Iterable:
    """Batches from a user's iterable of ``(x, y)``: iterated afresh each epoch."""

    def __init__(self, source: Iterable):
        self.source = source

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]  # a Sized iterable has one; others raise TypeError
        except TypeError:
            return 0

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Any, Any]]:
        count = 0
        for index, batch in enumerate(self.source):
            count += 1
            if index < start:
                continue
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise ConfigurationError(
                    message(
                        f"Each batch must be a pair (inputs, targets), and the {type(self.source).__name__} given "
                        f"as data yielded a {type(batch).__name__}",
                        expected="(x, y) arrays, or an iterable of (x, y) batches (a list of pairs, a torch "
                        "DataLoader, a tf.data.Dataset)",
                        fix="pass the data as a tuple (x, y)",
                    )
                )
            yield batch[0], batch[1]
        if count == 0 and epoch > 0:
            raise ConfigurationError(
                message(
                    f"The data yielded no batches in epoch {epoch}: it can be iterated only once",
                    expected="a re-iterable (a list, a Dataset, a DataLoader)",
                    received=type(self.source).__name__,
                    fix="pass a list or an object whose __iter__ starts over, or use epochs=1",
                )
            )


def as_batches(data: Any, batch_size: int = 32, shuffle: bool = True, seed: int | None = None) -> Batches | _Iterable:
    """``data`` as something with ``epoch(n)``: a pair of arrays becomes :class:`Batches`."""
    if isinstance(data, (Batches, _Iterable)):
        return data
    if isinstance(data, tuple) and len(data) == 2 and hasattr(data[0], "shape"):
        return Batches(data[0], data[1], batch_size=batch_size, shuffle=shuffle, seed=seed)
    if hasattr(data, "__iter__"):
        return _Iterable(data)
    raise ConfigurationError(
        message(
            "Unsupported training data",
            expected="(x, y) arrays or an iterable of (x, y) batches",
            received=type(data).__name__,
        )
    )


_DONE = object()


#: in-memory batches placed on the calling thread and timed before the prefetcher decides
PROBE = 4
#: the share of a step that placing a batch must take for a thread to be worth its hand-off
WORTH = 0.10


class Prefetcher:
    """Iterate ``batches`` with ``place`` applied (host -> device) ``depth`` batches ahead, on a
    background thread. ``waited`` is the seconds the consumer spent blocked on ``next``.

    With ``depth=0`` nothing runs ahead: each batch is placed when asked for, and that time
    counts as waiting (the baseline the prefetcher is measured against).

    It steps aside where it cannot help. The batches of :class:`Batches` (slices of arrays in
    memory) cost only what ``place`` costs; the first :data:`PROBE` are placed on the calling
    thread and timed, with the steps between them. When placing one takes under :data:`WORTH`
    of a step (the first of each, which may compile, left out), the rest are placed when asked
    for too, as with ``depth=0`` (``stepped_aside`` is then True; ``share`` is the share
    measured); otherwise the thread starts from there. A thread saves at most the placing, and
    only the part of it that can run beside the step: the GIL lets Python work run one thread
    at a time. ``benchmarks/prefetch.py``, the digits-sized ``mlp`` on two cores: placing took
    4-7% of a step on PyTorch and TensorFlow, whose small steps are Python work too, and the
    thread cost 4%; 15-25% on JAX, whose compiled step runs without the GIL, and it saved 11%
    (that was before the trainer handed JAX's step on its default CPU the numpy batches as they
    are, for ``jax.jit`` to place: there, placing is now next to nothing, and it steps aside).
    Batches from any other iterable (read, decoded, made) always get the thread.
    """

    def __init__(self, batches: Iterator, place: Callable[[Any], Any], depth: int = 2):
        self.batches, self.place, self.depth = batches, place, depth
        self.waited = 0.0
        self.stop = threading.Event()
        self.stepped_aside = False
        self.share: float | None = None  # placing's share of a step, once probed
        # (seconds placing, seconds of the step that followed) per probed batch; None: decided
        self._probe: list[list[float]] | None = [] if depth > 0 and isinstance(batches, _Slices) else None
        self._handed = 0.0  # when the last probed batch was handed out
        if depth > 0 and self._probe is None:
            self._start()

    def _start(self) -> None:
        self.queue: queue.Queue = queue.Queue(self.depth)
        self.thread = threading.Thread(target=self._fill, name="xdevice-prefetch", daemon=True)
        self.thread.start()

    def _probed(self, probe: list[list[float]], asked: float) -> Any:
        """The next in-memory batch, placed here and timed; after :data:`PROBE` of them, the
        decision: step aside, or start the thread."""
        if probe:
            probe[-1][1] = asked - self._handed  # the consumer's time with the last batch: a step
        if len(probe) < PROBE:
            began = time.perf_counter()
            item = self.place(next(self.batches))  # an epoch's end: StopIteration, as it should
            self._handed = time.perf_counter()
            probe.append([self._handed - began, 0.0])
            return item
        self._probe = None
        placing = statistics.median(p for p, _ in probe[1:])
        step = statistics.median(s for _, s in probe[1:])
        self.share = placing / step if step > 0 else float("inf")
        if self.share < WORTH:
            self.depth, self.stepped_aside = 0, True
            return self.place(next(self.batches))
        self._start()
        return self._queued()

    def _fill(self) -> None:
        try:
            for batch in self.batches:
                item = self.place(batch)
                while not self.stop.is_set():
                    try:
                        self.queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
            self.queue.put(_DONE)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            self.queue.put(error)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            if self.depth == 0:
                return self.place(next(self.batches))
            if self._probe is not None:
                return self._probed(self._probe, start)
            return self._queued()
        finally:
            self.waited += time.perf_counter() - start

    def _queued(self) -> Any:
        item = self.queue.get()
        if item is _DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stop.set()
