"""The dynamic batcher on its own: merging, limits, splitting, and stopping with work in flight."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import numpy as np
import pytest

from xdevice import InferenceError

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
from xdevice.serving.batcher import Batcher
from xdevice.serving.metrics import Stats


class Model:
    """``y = 10 * x + row index within the batch``: a caller given another's rows, or rows in
    the wrong order, sees it in its answer. Records each batch's row count."""

    def __init__(self, gate: threading.Event | None = None):
        self.batches: list[int] = []
        self.started = threading.Event()
        self.gate = gate

    def __call__(self, inputs):
        x = inputs["x"]
        self.batches.append(x.shape[0])
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        return {"y": 10 * x, "row": np.arange(x.shape[0])}


def batcher(model, **options) -> Batcher:
    settings = {
        "max_batch_size": 8,
        "max_queue_delay": 0.05,
        "stats": Stats(),
        "executor": concurrent.futures.ThreadPoolExecutor(1),
    } | options
    return Batcher(model, **settings)


def test_each_caller_gets_exactly_its_own_rows_from_merged_batches():
    model = Model()
    queue = batcher(model, max_batch_size=8)
    sizes = [1, 3, 2, 2, 4, 1, 3, 1, 2]  # 19 rows: at least three batches of at most 8

    async def main():
        requests = [np.full((n, 2), i, np.float32) for i, n in enumerate(sizes)]
        answers = await asyncio.gather(*(queue.submit({"x": x}) for x in requests))
        await queue.close()
        return requests, answers

    requests, answers = asyncio.run(main())
    for x, answer in zip(requests, answers):
        np.testing.assert_array_equal(answer["y"], 10 * x)
    assert sum(model.batches) == sum(sizes)
    assert max(model.batches) <= 8
    assert len(model.batches) < len(sizes)  # requests were merged
    rows = np.concatenate([a["row"] for a in answers])
    assert sorted(rows.tolist()) == sorted(r for b in model.batches for r in range(b))


def test_requests_with_different_trailing_shapes_are_not_merged():
    model = Model()
    queue = batcher(model)

    async def main():
        answers = await asyncio.gather(
            queue.submit({"x": np.ones((2, 3), np.float32)}), queue.submit({"x": np.ones((2, 4), np.float32)})
        )
        await queue.close()
        return answers

    first, second = asyncio.run(main())
    assert first["y"].shape == (2, 3) and second["y"].shape == (2, 4)
    assert model.batches == [2, 2]


def test_a_preferred_size_closes_the_batch_before_the_delay():
    model = Model()
    queue = batcher(model, max_queue_delay=5.0, preferred=(4,))

    async def main():
        start = asyncio.get_running_loop().time()
        await asyncio.gather(*(queue.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(4)))
        await queue.close()
        return asyncio.get_running_loop().time() - start

    assert asyncio.run(main()) < 2.0  # not the 5 s delay
    assert model.batches == [4]


def test_closing_finishes_the_running_batch_and_fails_the_queued_requests():
    gate = threading.Event()
    model = Model(gate)
    queue = batcher(model, max_batch_size=2, max_queue_delay=0.0)

    async def main():
        running = [asyncio.ensure_future(queue.submit({"x": np.full((1, 2), i, np.float32)})) for i in range(2)]
        await asyncio.get_running_loop().run_in_executor(None, model.started.wait, 10)
        queued = asyncio.ensure_future(queue.submit({"x": np.ones((1, 2), np.float32)}))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(queue.close())
        await asyncio.sleep(0.05)
        gate.set()  # the running batch may now finish
        await closing
        return await asyncio.gather(*running), await asyncio.gather(queued, return_exceptions=True)

    answers, (failure,) = asyncio.run(main())
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer["y"], np.full((1, 2), 10 * i))
    assert isinstance(failure, InferenceError)
    assert "unloaded" in str(failure)
    assert model.batches == [2]


def test_a_failing_run_fails_every_caller_of_that_batch_and_the_batcher_keeps_going():
    calls = []

    def flaky(inputs):
        calls.append(inputs["x"].shape[0])
        if len(calls) == 1:
            raise RuntimeError("boom")
        return {"y": inputs["x"]}

    queue = batcher(flaky, max_batch_size=2, max_queue_delay=0.05)

    async def main():
        first = await asyncio.gather(
            *(queue.submit({"x": np.ones((1, 2), np.float32)}) for _ in range(2)), return_exceptions=True
        )
        second = await queue.submit({"x": np.ones((1, 2), np.float32)})
        await queue.close()
        return first, second

    first, second = asyncio.run(main())
    assert all(isinstance(f, RuntimeError) for f in first)
    assert second["y"].shape == (1, 2)


def test_a_request_that_waited_past_its_timeout_is_rejected_or_delayed_as_the_policy_says():
    from xdevice.serving.protocol import BadRequest

    async def one(**policy):
        queue = batcher(Model(), max_queue_delay=0.2, **policy)  # a lone request waits the full 0.2 s
        try:
            return await queue.submit({"x": np.ones((1, 2), np.float32)})
        finally:
            await queue.close()

    with pytest.raises(BadRequest, match="past its timeout") as late:
        asyncio.run(one(timeout=0.05, reject_late=True))
    assert late.value.status == 503
    assert asyncio.run(one(timeout=0.05, reject_late=False))["y"].tolist() == [[10.0, 10.0]]  # DELAY: runs
    assert asyncio.run(one(timeout=1.0, reject_late=True))["y"].tolist() == [[10.0, 10.0]]


def test_a_full_queue_refuses_the_next_request():
    from xdevice.serving.protocol import BadRequest

    model = Model(gate=threading.Event())

    async def main():
        queue = batcher(model, max_batch_size=1, max_queue_delay=0.0, max_queue_size=2)
        first = asyncio.ensure_future(queue.submit({"x": np.ones((1, 2), np.float32)}))
        await asyncio.sleep(0.05)  # the first runs (and blocks on the gate); two more wait
        waiting = [asyncio.ensure_future(queue.submit({"x": np.ones((1, 2), np.float32)})) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(BadRequest, match="queue is full") as full:
            await queue.submit({"x": np.ones((1, 2), np.float32)})
        model.gate.set()
        done = await asyncio.gather(first, *waiting)
        await queue.close()
        return full.value.status, len(done)

    assert asyncio.run(main()) == (503, 3)


def test_merged_runs_of_a_fast_model_run_on_the_event_loop():
    ran_on = []

    def run(inputs):
        ran_on.append(threading.current_thread().name)
        return {"y": 10 * inputs["x"]}

    instances = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="instance")
    queue = batcher(run, max_batch_size=4, inline_below=1e-3, executor=instances, measure=False)

    async def main():
        async def four():
            return await asyncio.gather(*(queue.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(4)))

        answers = [await four()]  # the first merged run: not timed yet, on an instance thread
        # How long a run takes depends on the machine's load: set the measure, so what is
        # checked is the choice it drives.
        queue.merged_recent = 1e-4  # as if its merged runs took 0.1 ms
        answers.append(await four())
        queue.merged_recent = 1e-2  # as if they took 10 ms: a run that long would stall the loop
        answers.append(await four())
        await queue.close()
        return threading.current_thread().name, answers

    loop_thread, answers = asyncio.run(main())
    assert ran_on[0].startswith("instance") and ran_on[1] == loop_thread and ran_on[2].startswith("instance")
    for four in answers:
        assert [a["y"].tolist() for a in four] == [[[10.0 * i] * 2] for i in range(4)]
