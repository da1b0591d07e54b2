"""Batches and the prefetcher: seeded order, resumable positions, errors handed over."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from xdevice.training.data import PROBE, Batches, Prefetcher


def test_the_order_depends_on_seed_and_epoch_only():
    x = np.arange(20)
    first = [b.tolist() for b, _ in Batches(x, x, batch_size=6, seed=4).epoch(1)]
    again = [b.tolist() for b, _ in Batches(x, x, batch_size=6, seed=4).epoch(1)]
    other = [b.tolist() for b, _ in Batches(x, x, batch_size=6, seed=4).epoch(2)]
    assert first == again != other
    assert sorted(sum(first, [])) == list(range(20))
    assert [len(b) for b in first] == [6, 6, 6, 2]


def test_an_epoch_resumes_at_a_batch_number():
    x = np.arange(20)
    data = Batches(x, x, batch_size=6, seed=4)
    whole = [b.tolist() for b, _ in data.epoch(3)]
    assert [b.tolist() for b, _ in data.epoch(3, start=2)] == whole[2:]


def test_prefetching_keeps_order_and_places_every_batch():
    placed_on = []

    def place(batch):
        placed_on.append(threading.current_thread().name)
        return batch * 10

    loader = Prefetcher(iter([np.array([i]) for i in range(7)]), place, depth=2)
    assert [int(b[0]) for b in loader] == [0, 10, 20, 30, 40, 50, 60]
    assert set(placed_on) == {"xdevice-prefetch"}  # off the training thread


def test_a_failing_data_source_fails_the_training_loop():
    def broken():
        yield np.zeros(1)
        raise OSError("disk gone")

    loader = Prefetcher(broken(), lambda b: b, depth=2)
    next(loader)
    with pytest.raises(OSError, match="disk gone"):
        next(loader)


def test_without_prefetch_placing_happens_on_demand():
    names = []
    loader = Prefetcher(iter([1, 2]), lambda b: names.append(threading.current_thread().name) or b, depth=0)
    assert list(loader) == [1, 2]
    assert names == [threading.current_thread().name] * 2


def test_mismatched_rows_are_refused():
    from xdevice import ConfigurationError

    with pytest.raises(ConfigurationError, match="x 5, y 4"):
        Batches(np.zeros(5), np.zeros(4))


def _consume(loader, seconds_per_step):
    """Every batch of ``loader``, as a training loop takes them (a step of ``seconds_per_step``)."""
    taken = []
    for batch in loader:
        time.sleep(seconds_per_step)
        taken.append(batch)
    return taken


def _placing(names, seconds=0.0):
    def place(batch):
        names.append(threading.current_thread().name)
        time.sleep(seconds)
        return batch

    return place


def test_in_memory_batches_quicker_to_place_than_a_step_are_placed_when_asked_for_without_a_thread():
    """The prefetcher steps aside where it cannot help: slices of arrays in memory, cheap to place."""
    names = []
    x = np.arange(40, dtype=np.float32)
    loader = Prefetcher(Batches(x, x, batch_size=4, shuffle=False).epoch(0), _placing(names), depth=2)
    taken = _consume(loader, 0.005)
    assert [b[0] for b, _ in taken] == list(range(0, 40, 4))  # every batch, in order
    assert loader.stepped_aside
    assert names == [threading.current_thread().name] * 10


def test_in_memory_batches_slow_to_place_get_the_thread_after_the_probe():
    names = []
    x = np.arange(40)
    loader = Prefetcher(Batches(x, x, batch_size=4, shuffle=False).epoch(0), _placing(names, 0.005), depth=2)
    taken = _consume(loader, 0.001)
    assert [b[0] for b, _ in taken] == list(range(0, 40, 4))
    assert not loader.stepped_aside
    assert names[:PROBE] == [threading.current_thread().name] * PROBE  # placed here and timed first
    assert set(names[PROBE:]) == {"xdevice-prefetch"}


def test_an_epoch_shorter_than_the_probe_is_placed_in_order_without_a_thread():
    names = []
    x = np.arange(6)
    loader = Prefetcher(Batches(x, x, batch_size=4, shuffle=False).epoch(0), _placing(names, 0.005), depth=2)
    assert [len(b) for b, _ in loader] == [4, 2]
    assert names == [threading.current_thread().name] * 2
    empty = np.zeros((0, 3), np.float32)
    assert list(Prefetcher(Batches(empty, empty).epoch(0), lambda b: b, depth=2)) == []


def test_fit_on_arrays_quicker_to_place_than_a_step_runs_no_prefetch_thread():
    from xdevice import fit, models
    from xdevice.training.callbacks import Callback

    seen = []

    class SlowStep(Callback):  # a step of at least 2 ms, whatever the machine: placing is a fraction of it
        def on_step_end(self, trainer, step, logs):
            time.sleep(0.002)
            seen.append(any(t.name == "xdevice-prefetch" for t in threading.enumerate()))

    model = models.build("mlp", inputs=4, hidden=[8], classes=3, backend="numpy", seed=0)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    fit(model, (x, np.arange(64) % 3), epochs=1, batch_size=8, prefetch=2, verbose=0, callbacks=[SlowStep()])
    assert seen == [False] * 8
