"""The dynamic batcher steps aside where merging does not pay, and keeps batching where it does.

The decision is a pure function of measured costs (tested with given numbers first); then the
real server on loopback, driven by tritonclient, serves one model whose work grows faster than
its rows (merging costs more, so the batcher must stop adding queue delay) and one whose run
costs about the same at any batch size (merging pays, so it must keep merging).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import numpy as np
import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
from xdevice.serving.batcher import HOLD, PROBE, batching_pays, cost_per_request

from .onnx_models import dense_model, onnx_model, write_model

DELAY_US = 200_000  # a queue delay no one could miss in a latency
CONFIG = f"""max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


# -- the decision, from given numbers ---------------------------------------------------------


def test_batching_pays_only_when_merged_runs_are_cheaper_per_request_by_the_margin():
    assert batching_pays(single=1e-3, merged=0.2e-3)
    assert batching_pays(single=1e-3, merged=0.9e-3)  # exactly the 10% margin
    assert not batching_pays(single=1e-3, merged=0.95e-3)
    assert not batching_pays(single=1e-3, merged=1.3e-3)  # concatenating and splitting cost more
    assert not batching_pays(single=1e-3, merged=0.5e-3, min_saving=0.6)  # a margin of one's own


def test_stepping_back_needs_twice_the_saving_so_near_equal_costs_do_not_flip_it():
    assert batching_pays(single=1e-3, merged=0.85e-3, batching=True)  # batching: 15% keeps it
    assert not batching_pays(single=1e-3, merged=0.85e-3, batching=False)  # aside: 15% is not enough
    assert batching_pays(single=1e-3, merged=0.8e-3, batching=False)


def test_batching_is_kept_until_both_ways_are_measured():
    assert batching_pays(single=math.nan, merged=1e-3)
    assert batching_pays(single=1e-3, merged=math.nan)


def test_cost_per_request_weighs_each_request_of_a_merged_run():
    # one run of 8 requests at 0.5 ms each outweighs two runs of one request at 3 ms
    assert cost_per_request([(4e-3, 8), (3e-3, 1), (3e-3, 1)]) == pytest.approx(0.5e-3)
    # one-request batches (no company came) cost what a run alone costs: no saving
    assert cost_per_request([(1e-3, 1)] * 5) == pytest.approx(1e-3)
    assert math.isnan(cost_per_request([]))


# -- the real server ----------------------------------------------------------------------------


def pairwise_model(width: int = 65536):
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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("starlette")
    pytest.importorskip("tritonclient.http")
    from xdevice.serving.server import Server

    root = tmp_path_factory.mktemp("repo")
    write_model(root, "pairwise", pairwise_model(), versions=(1,), config=CONFIG)
    write_model(root, "fixed_cost", dense_model(), versions=(1,), config=CONFIG)
    with Server(root, threads=1) as running:
        yield running


def load(server, model: str, width: int, requests: int, concurrency: int) -> list[float]:
    """Send ``requests`` batch-1 requests from ``concurrency`` tritonclient coroutines; the
    latency of each, in seconds."""
    import tritonclient.http as httpclient
    import tritonclient.http.aio as aioclient

    x = np.ones((1, width), np.float32)
    latencies: list[float] = []

    async def main():
        async with aioclient.InferenceServerClient(server.url) as client:
            left = iter(range(requests))

            async def worker():
                for _ in left:
                    tensor = httpclient.InferInput("x", [1, width], "FP32")
                    tensor.set_data_from_numpy(x)
                    start = time.perf_counter()
                    await client.infer(model, [tensor])
                    latencies.append(time.perf_counter() - start)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(main())
    return latencies


def batch_counts(server, model: str) -> dict[int, int]:
    """Runs per batch size, from the statistics extension."""
    import tritonclient.http as httpclient

    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)["model_stats"][0]
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats.get("batch_stats", [])}


def test_a_model_that_merging_cannot_help_is_served_without_the_queue_delay(server, caplog):
    caplog.set_level(logging.DEBUG, logger="xdevice.serving")  # on failure, every decision shows
    # PROBE runs as configured (up to 8 requests each), PROBE alone, then the decision
    load(server, "pairwise", 8, 9 * PROBE + 64, concurrency=8)
    aside = [r.getMessage() for r in caplog.records if "stepping aside" in r.getMessage()]
    assert len(aside) == 1, [r.getMessage() for r in caplog.records]
    assert "ms per request in merged runs" in aside[0]

    alone = load(server, "pairwise", 8, 10, concurrency=1)
    assert np.median(alone) < DELAY_US / 1e6 / 2  # no 200 ms wait for company that never comes


def test_a_model_that_merging_helps_keeps_merging(server, caplog):
    caplog.set_level(logging.DEBUG, logger="xdevice.serving")  # on failure, every decision shows
    load(server, "fixed_cost", 4, 8 * PROBE + PROBE + 64, concurrency=8)  # measured both ways, decided
    before = batch_counts(server, "fixed_cost")
    load(server, "fixed_cost", 4, min(HOLD, 4 * 8), concurrency=8)
    after = batch_counts(server, "fixed_cost")

    merged = sum(after.get(size, 0) - before.get(size, 0) for size in after if size > 1)
    assert merged > 0, (before, after)
    assert not [r.getMessage() for r in caplog.records if "stepping aside" in r.getMessage()]
