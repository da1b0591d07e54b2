"""Training on a GPU: one GPU trains as the CPU does (float32, and bfloat16 with float32 master
weights), a model split over the GPU and the CPU trains as the whole model, zoo models agree with
the numpy reference on the GPU, exports from the GPU run in ONNX Runtime's CUDA provider, and
PyTorch's GPU ranks reduce over NCCL."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import xdevice
from tests.training.test_stages import FIT, data, jax_stages
from xdevice import fit, models
from xdevice.testing import compare

from .conftest import needs, needs_ort_gpu

pytestmark = pytest.mark.gpu
SPEC = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_a_zoo_model_trains_on_the_gpu_as_on_the_cpu(name):
    needs(name)
    on_cpu, on_gpu = models.build("mlp", backend=name, **SPEC), models.build("mlp", backend=name, **SPEC)
    expected = fit(on_cpu, data(), device="cpu", **FIT)
    got = fit(on_gpu, data(), device="gpu:0", **FIT)
    assert on_gpu.device == xdevice.Device("gpu", 0)
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)  # GPU kernels round differently


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_bfloat16_training_on_the_gpu_learns_with_float32_master_weights(name):
    needs(name)
    model = models.build("mlp", backend=name, **SPEC)
    history = fit(model, data(), device="gpu:0", precision="bfloat16", **{**FIT, "epochs": 4})
    assert np.isfinite(history.steps).all() and history["loss"][-1] < history["loss"][0]
    assert {str(v.dtype) for v in model.numpy_params().values()} == {"float32"}


@pytest.mark.parametrize("zoo", ["mlp", "cnn"])
@pytest.mark.parametrize("name", ["torch", "jax"])
def test_a_zoo_model_on_the_gpu_agrees_with_the_numpy_reference(name, zoo):
    """At float32's tolerance: the project's default precision is "highest", so no TF32 rounding."""
    needs(name)
    model = models.build(zoo, backend="numpy", seed=0)
    reference = model.to("numpy", dtype="float64")
    x = reference.example_input(4, 0)
    on_gpu = model.to(name, device="gpu:0")
    out = on_gpu(x)
    assert xdevice.device_of(out) == xdevice.Device("gpu", 0)
    result = compare(xdevice.convert(out, to="numpy"), reference(x), "float32")
    assert result.ok, result


def test_a_torch_sequential_split_over_gpu_and_cpu_trains_as_the_whole_model():
    needs("torch")
    import torch

    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    split = copy.deepcopy(whole)
    expected = fit(whole, data(), **FIT)
    got = fit(split, data(), stages=["gpu:0", "cpu"], **FIT)
    assert split[0].weight.device.type == "cuda" and split[2].weight.device.type == "cpu"
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)
    x = torch.tensor(data()[0][:4])
    torch.testing.assert_close(split(x.cuda()).cpu(), whole(x), rtol=1e-4, atol=1e-5)  # runs as one module


def test_jax_stages_on_gpu_and_cpu_train_as_the_whole_model():
    needs("jax")
    (first, a), (second, b) = jax_stages()
    cpu = xdevice.find("cpu", backend="jax")
    expected = fit((lambda p, x: second(p["b"], first(p["a"], x)), {"a": a, "b": b}), data(), device=cpu, **FIT)
    got = fit([(first, a), (second, b)], data(), stages=["gpu:0", "cpu"], **FIT)
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)
    (_, a_trained), (_, b_trained) = got.model
    assert a_trained["w"].devices().pop().platform == "gpu"
    assert b_trained["w"].devices().pop().platform == "cpu"


def test_a_model_exported_on_the_gpu_runs_in_onnx_runtimes_cuda_provider(tmp_path):
    needs("torch", "onnx")  # exports with torch.onnx
    needs_ort_gpu()
    from xdevice.converters import export
    from xdevice.serving import Session

    model = models.build("cnn", backend="torch", seed=0).to("torch", device="gpu:0")
    export(model, tmp_path / "cnn.onnx")  # verified against the GPU outputs by ONNX Runtime
    session = Session(tmp_path / "cnn.onnx", "gpu:0")
    x = model.example_input(4, 0)
    got = session.run({session.inputs[0].name: x})[session.outputs[0].name]
    assert session.providers[0] == "CUDAExecutionProvider"
    assert compare(got, xdevice.convert(model(x), to="numpy"), "float32").ok


@pytest.mark.parametrize("producer", ["torch", "jax"])
def test_gpu_arrays_are_bound_to_an_onnx_runtime_cuda_session_in_place(tmp_path, producer):
    """The IO-binding path: an input already on the session's GPU goes in by its device pointer,
    and the output comes back as the producer's array on that GPU."""
    needs("torch", producer, "onnx")
    needs_ort_gpu()
    from xdevice.converters import export
    from xdevice.serving import Session

    model = models.build("mlp", backend="torch", inputs=8, hidden=[16], classes=4, seed=0)
    export(model, tmp_path / "mlp.onnx")
    session = Session(tmp_path / "mlp.onnx", "gpu:0")
    x = model.example_input(4, 0)
    on_gpu = xdevice.to_device(xdevice.convert(x, to=producer), "gpu:0")
    out = session.run({session.inputs[0].name: on_gpu}, to=producer)[session.outputs[0].name]
    assert xdevice.backend_of(out) == producer and xdevice.device_of(out) == xdevice.Device("gpu", 0)
    assert compare(
        xdevice.convert(out, to="numpy"), session.run({session.inputs[0].name: x})[session.outputs[0].name]
    ).ok


def test_a_torch_gpu_rank_reduces_over_nccl_bound_to_its_gpu_and_its_cpu_tensors_over_gloo(run_python):
    needs("torch")
    result = run_python(
        """
        import json, torch, torch.distributed as dist
        from xdevice.backends.torch.replication import join
        join([torch.device("cuda", 0)])
        gpu, cpu = torch.ones(4, device="cuda:0"), torch.ones(4)
        dist.all_reduce(gpu), dist.all_reduce(cpu)
        bound = str(dist.group.WORLD.bound_device_id)
        print(json.dumps([dist.get_backend(), bound, gpu.sum().item(), cpu.sum().item()]))
        dist.destroy_process_group()
        """,
        env={"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    backend, bound, gpu_sum, cpu_sum = json.loads(result.stdout.splitlines()[-1])
    assert "nccl" in backend and "gloo" in backend and bound == "cuda:0" and gpu_sum == cpu_sum == 4.0


def test_a_torch_host_batch_reaches_the_gpu_by_a_pinned_copy(gpu_device):
    """The trainer's placing (``to_device``) copies from page-locked memory, which DMA reads
    while the step runs; a pageable copy shows in the profiler as ``Pageable -> Device``."""
    needs("torch")
    import torch
    from torch.profiler import ProfilerActivity, profile

    engine = xdevice.backend("torch")
    batch = torch.arange(1 << 20, dtype=torch.float32)
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as trace:  # torch 2.11 warns without
        placed = engine.to_device(batch, gpu_device)
        torch.cuda.synchronize()
    copies = [e.name for e in trace.events() if "Memcpy HtoD" in e.name]
    assert copies and all("Pinned" in name for name in copies), copies
    assert placed.device.type == "cuda" and int(placed[-1]) == (1 << 20) - 1
    assert not batch.is_pinned()  # the caller's tensor is left as it was
