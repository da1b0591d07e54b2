"""Batches and the prefetcher: seeded order, resumable positions, errors handed over."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from xdevice.training.data import Batches, Prefetcher


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
