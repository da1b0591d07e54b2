"""The dynamic batcher steps aside where merging lowers the rate requests are answered at, or
finds no company, and keeps batching where it does not.

The decision is a pure function of measured rates, and the course that measures them a state
machine over the times it is given: both are tested with given numbers and times first, so
what is checked never depends on this machine's speed or load. Then the real server on
loopback, driven by tritonclient, serves models whose difference no load can hide: one whose
work grows with the square of the rows run together (merging costs far more), one whose run
costs the same at any batch size (merging answers many times more requests), and a lone client
(no company ever comes).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
from xdevice.serving.batcher import HOLD, HOLD_REQUESTS, IDLE, LONE_RUNS, PHASE_ANSWERS, Course, choose

from .onnx_models import onnx_model, write_model

# -- the decision, from given numbers -----------------------------------------------------------


def test_merging_that_answers_more_requests_a_second_is_kept():
    assert choose([{"merged": 6000, "single": 5000}, {"merged": 6400, "single": 5300}]) == "merged"


def test_merging_level_with_runs_alone_steps_aside_so_the_rate_never_drops_below_plain():
    # a few percent either way is what a short phase measures to: alone is the plain rate
    assert choose([{"merged": 3300, "single": 3400}, {"merged": 3350, "single": 3300}]) == "single"
    assert choose([{"merged": 3400, "single": 3300}] * 3) == "single"  # 3% more: within the noise
    assert choose([{"merged": 3500, "single": 3300}] * 3) == "merged"  # 6% more


def test_merging_that_answers_fewer_requests_a_second_steps_aside():
    assert choose([{"merged": 2000, "single": 3000}, {"merged": 2100, "single": 3100}]) == "single"
    assert choose([{"merged": 3000, "single": 3300}] * 3) == "single"  # 9% fewer


def test_one_disturbed_round_does_not_decide():
    # another program took the CPU during one phase: the median of the rounds ignores it
    rounds = [{"merged": 4000, "single": 3000}, {"merged": 4000, "single": 9000}, {"merged": 4000, "single": 3000}]
    assert choose(rounds) == "merged"
    rounds = [{"merged": 2000, "single": 3000}, {"merged": 9000, "single": 3000}, {"merged": 2000, "single": 3000}]
    assert choose(rounds) == "single"


def test_merged_runs_of_one_request_each_step_aside_whatever_the_rates():
    assert choose([{"merged": 3000, "single": 3000}], batch=1.0) == "single"


# -- the course, over given times ----------------------------------------------------------------


def serve(
    course: Course,
    rates: dict[str, float],
    seconds: float = 60.0,
    *,
    batch: int = 8,
    start: float = 0.0,
    requests: float = math.inf,
    until: Callable[[Course], bool] = lambda course: False,
):
    """Requests arriving and answered back to back from ``start`` for ``seconds``, or
    ``requests`` of them, or until ``until(course)``: ``batch`` at a time when the course
    says merged, one at a time alone, each way at its ``rates[way]`` requests a second.
    Returns the time it ends and the way of each run."""
    now, ways, sent = start, [], 0
    while now < start + seconds and sent < requests and not until(course):
        phases = [course.arrived(now)]
        way = course.way
        if way == "merged":
            phases += [course.arrived(now) for _ in range(batch - 1)]
        now += len(phases) / rates[way]
        course.done(now, phases)
        ways.append(way)
        sent += len(phases)
    return now, ways


def decided(course: Course) -> bool:
    return not course.measuring


def test_a_course_keeps_merging_where_merged_runs_answer_more_requests():
    course = Course()
    serve(course, {"merged": 6000, "single": 5000}, until=decided)
    assert not course.measuring and course.batching and course.way == "merged"
    assert [way for way, _ in course.rates].count("single") > 0  # both ways were measured


def test_a_course_steps_aside_where_merged_runs_answer_fewer_requests(caplog):
    caplog.set_level(logging.INFO, logger="xdevice.serving")
    course = Course("pairwise version 1")
    serve(course, {"merged": 2000, "single": 3000}, until=decided)
    assert not course.measuring and not course.batching and course.way == "single"
    (line,) = [r.getMessage() for r in caplog.records if "stepping aside" in r.getMessage()]
    assert line.startswith("pairwise version 1:")
    assert "2000 requests/s merged, 3000 requests/s run alone" in line


def test_a_lone_client_steps_aside_after_a_few_runs_without_measuring_runs_alone():
    course = Course()
    _, ways = serve(course, {"merged": 1000, "single": 1500}, seconds=1.0, batch=1)
    assert ways[:LONE_RUNS] == ["merged"] * LONE_RUNS
    assert set(ways[LONE_RUNS:]) == {"single"}


def test_a_decision_holds_its_time_and_requests_then_both_ways_are_measured_again():
    course = Course()
    end, _ = serve(course, {"merged": 2000, "single": 3000}, until=decided)  # merging costs more: aside
    assert course.way == "single"
    faster = {"merged": 9000, "single": 3000}  # the model or the load changed: merging would pay now
    end, ways = serve(course, faster, HOLD - 1.0, start=end)
    assert set(ways) == {"single"} and not course.measuring  # held
    serve(course, faster, 5.0, start=end)
    assert course.way == "merged" and course.batching  # measured again, and merging now


def test_after_a_pause_the_load_is_measured_again_once_the_hold_served_its_requests():
    rates = {"merged": 2000, "single": 3000}
    course = Course()
    end, _ = serve(course, rates, until=decided)
    end, _ = serve(course, rates, requests=HOLD_REQUESTS // 2, start=end + 2 * IDLE)  # after a pause
    assert not course.measuring  # too few requests served since the decision
    serve(course, rates, requests=HOLD_REQUESTS, start=end, until=lambda course: course.measuring)
    assert course.measuring and course.served == HOLD_REQUESTS  # long before HOLD seconds


def test_a_pause_while_measuring_is_neither_ways_time():
    course = Course()
    end, _ = serve(course, {"merged": 6000, "single": 5000}, 0.01)  # part of the first phase
    serve(course, {"merged": 6000, "single": 5000}, 0.5, start=end + 5.0)  # then a 5 s pause
    way, rate = course.rates[0]
    assert way == "merged" and rate == pytest.approx(6000, rel=0.05)


def test_answers_to_requests_of_the_way_before_count_for_neither_phase():
    course = Course()
    old = course.arrived(0.0)
    serve(course, {"merged": 6000, "single": 5000}, 0.1)  # the first phase ended
    phase, rates = course.phase, list(course.rates)
    assert old != phase
    course.done(0.2, [old] * (10 * PHASE_ANSWERS))  # a late batch of the phase before
    assert course.phase == phase and course.rates == rates


def test_a_phase_is_timed_once_the_requests_of_the_way_before_are_answered():
    course = Course()
    late = [course.arrived(0.0) for _ in range(8)]  # merged requests still in flight when the way changes
    end, _ = serve(course, {"merged": 6000, "single": 5000}, until=lambda course: course.way == "single")
    for _ in range(100):  # slowed by the late batch: not the single way's own pace
        phase = course.arrived(end)
        end += 1 / 1000
        course.done(end, [phase])
    course.done(end, late)
    serve(course, {"merged": 6000, "single": 5000}, start=end, until=lambda course: course.way != "single")
    assert course.rates[1] == ("single", pytest.approx(5000, rel=0.05))


def test_failed_or_refused_requests_are_not_counted_as_answers():
    course = Course()
    now = 0.0
    for _ in range(10 * PHASE_ANSWERS):
        phase = course.arrived(now)
        now += 0.001
        course.done(now, [phase], answered=False)
    assert course.rates == [] and course.in_flight == 0


# -- the real server ----------------------------------------------------------------------------

DELAY_US = 200_000  # a queue delay no one could miss in a latency
LONE_DELAY_US = 100_000  # the lone client's: it waits this LONE_RUNS times before the batcher steps aside
CONFIG = f"""max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def pairwise_model(width: int = 131072):
    """``y = x + 0 * sum(wide @ wide.T)``, ``wide`` = each row of ``x`` repeated to ``8 * width``
    numbers: every row's answer is its own, but the work grows with the square of the rows run
    together (a pairwise product of them), so a merged run of k requests costs about k times
    more per request than runs alone, however busy the machine."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Unsqueeze", ["x", "last"], ["x3"]),
        helper.make_node("Expand", ["x3", "shape"], ["wide3"]),
        helper.make_node("Reshape", ["wide3", "flat"], ["wide"]),
        helper.make_node("Transpose", ["wide"], ["wide_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["wide", "wide_t"], ["pairs"]),
        helper.make_node("ReduceSum", ["pairs"], ["total"], keepdims=0),
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
        helper.make_node("Add", ["x", "nothing"], ["y"]),
    ]
    return onnx_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [
            numpy_helper.from_array(np.array([2], np.int64), "last"),
            numpy_helper.from_array(np.array([1, 1, width], np.int64), "shape"),
            numpy_helper.from_array(np.array([0, -1], np.int64), "flat"),
            numpy_helper.from_array(np.array(0, np.float32), "zero"),
        ],
    )


def fixed_cost_model(size: int = 384):
    """``y = x + 0 * sum((c * sum(x)) @ c)``, ``c`` a constant ``size`` x ``size`` matrix: one
    product of that size whatever the rows (it depends on ``x``, so ONNX Runtime cannot fold
    it away), so a merged run of k requests costs about what one request alone does."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Mul", ["c", "s"], ["cs"]),
        helper.make_node("MatMul", ["cs", "c"], ["product"]),
        helper.make_node("ReduceSum", ["product"], ["total"], keepdims=0),
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
        helper.make_node("Add", ["x", "nothing"], ["y"]),
    ]
    c = np.random.default_rng(0).normal(size=(size, size)).astype(np.float32)
    return onnx_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(c, "c"), numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("starlette")
    pytest.importorskip("tritonclient.http")
    from xdevice.serving.server import Server

    root = tmp_path_factory.mktemp("repo")
    write_model(root, "pairwise", pairwise_model(), versions=(1,), config=CONFIG)
    write_model(root, "fixed_cost", fixed_cost_model(), versions=(1,), config=CONFIG)
    write_model(
        root, "lone", fixed_cost_model(size=4), versions=(1,), config=CONFIG.replace(str(DELAY_US), str(LONE_DELAY_US))
    )
    with Server(root, threads=1) as running:
        yield running


def course(server, model: str) -> Course:
    course = server.app.state.dataplane.models.get(model).batcher.course
    assert course is not None
    return course


def load(server, model: str, width: int, concurrency: int, requests: int = 0) -> list[float]:
    """Send batch-1 requests from ``concurrency`` tritonclient coroutines: ``requests`` of them,
    or (0) until the model's batcher has decided; the latency of each, in seconds."""
    import tritonclient.http as httpclient
    import tritonclient.http.aio as aioclient

    x = np.ones((1, width), np.float32)
    latencies: list[float] = []
    decided = course(server, model)

    async def main():
        async with aioclient.InferenceServerClient(server.url) as client:
            sent = 0

            async def worker():
                nonlocal sent
                while (sent < requests) if requests else (decided.measuring and sent < 5000):
                    sent += 1
                    tensor = httpclient.InferInput("x", [1, width], "FP32")
                    tensor.set_data_from_numpy(x)
                    loop = asyncio.get_running_loop()
                    start = loop.time()
                    result = await client.infer(model, [tensor])
                    latencies.append(loop.time() - start)
                    np.testing.assert_allclose(result.as_numpy("y"), x)  # each its own answer

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(main())
    return latencies


def batch_counts(server, model: str) -> dict[int, int]:
    """Runs per batch size, from the statistics extension."""
    import tritonclient.http as httpclient

    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)["model_stats"][0]
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats.get("batch_stats", [])}


def test_a_model_that_merging_slows_steps_aside_and_serves_without_the_queue_delay(server, caplog):
    caplog.set_level(logging.DEBUG, logger="xdevice.serving")  # on failure, every decision shows
    load(server, "pairwise", 8, concurrency=8)
    aside = [r.getMessage() for r in caplog.records if "stepping aside" in r.getMessage()]
    assert len(aside) == 1, [r.getMessage() for r in caplog.records]
    assert "requests/s" in aside[0] and course(server, "pairwise").way == "single"

    alone = load(server, "pairwise", 8, concurrency=1, requests=10)
    assert np.median(alone) < DELAY_US / 1e6 / 2  # no 200 ms wait for company that never comes


def test_a_model_that_merging_helps_keeps_merging(server, caplog):
    caplog.set_level(logging.DEBUG, logger="xdevice.serving")  # on failure, every decision shows
    load(server, "fixed_cost", 4, concurrency=8)  # measured both ways, decided
    assert course(server, "fixed_cost").batching
    before = batch_counts(server, "fixed_cost")
    load(server, "fixed_cost", 4, concurrency=8, requests=4 * 8)
    after = batch_counts(server, "fixed_cost")

    merged = sum(after.get(size, 0) - before.get(size, 0) for size in after if size > 1)
    assert merged > 0, (before, after)
    assert not [r.getMessage() for r in caplog.records if "stepping aside" in r.getMessage()]


def test_a_lone_client_is_served_without_the_queue_delay_after_a_few_requests(server):
    waited = load(server, "lone", 4, concurrency=1, requests=LONE_RUNS)  # no company comes to its batches
    assert course(server, "lone").way == "single"
    alone = load(server, "lone", 4, concurrency=1, requests=10)
    assert np.median(alone) < LONE_DELAY_US / 1e6 / 2 <= np.median(waited)
