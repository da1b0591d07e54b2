"""Triton's CUDA shared-memory extension where no GPU serves: every registration is refused by
name on both transports (unmodified tritonclient against the real server on loopback), a
malformed registration names its field, and the CUDA runtime's loading says what it tried.
The round trip on a GPU server is tests/gpu/test_cuda_shared_memory.py."""

from __future__ import annotations

import base64
import ctypes.util
import http.client
import json

import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from xdevice.serving.cuda_memory import (  # noqa: E402 - below the importorskip guard
    CudaRuntime,
    CudaSharedMemory,
    RuntimeMissing,
    cudart_candidates,
)

from .onnx_models import dense_model, write_model  # noqa: E402 - below the importorskip guard

HANDLE = base64.b64encode(bytes(range(64)))  # a handle's shape (64 bytes), as get_raw_handle gives it


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The conftest's ``server`` serves this, on the CPU."""
    pytest.importorskip("onnx")
    root = tmp_path_factory.mktemp("cuda_shm")
    write_model(root, "dense", dense_model(), versions=(1,))
    return root


@pytest.fixture
def clients(server):
    both = {
        "http": httpclient.InferenceServerClient(server.url),
        "grpc": grpcclient.InferenceServerClient(server.grpc_url),
    }
    yield both
    for client in both.values():
        client.close()


def _regions(client, transport):
    status = client.get_cuda_shared_memory_status()
    return [r["name"] for r in status] if transport == "http" else sorted(status.regions)


def _post(server, path, body):
    connection = http.client.HTTPConnection(server.url, timeout=10)
    connection.request("POST", path, json.dumps(body))
    answer = connection.getresponse()
    text = answer.read().decode()
    connection.close()
    return answer.status, json.loads(text)["error"] if text else ""


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_registration_on_a_cpu_server_is_refused_by_name_with_the_fix(clients, transport):
    client = clients[transport]
    with pytest.raises(InferenceServerException) as caught:
        client.register_cuda_shared_memory("gpu0", HANDLE, 0, 64)
    text = str(caught.value)
    assert ("[400]" in text) if transport == "http" else ("INVALID_ARGUMENT" in text)
    assert "CUDA shared memory (region 'gpu0') is not available" in text
    assert "needs a GPU session" in text and "runs every model on the CPU" in text
    assert "Fix: register system shared memory instead" in text and "onnxruntime-gpu" in text
    assert _regions(client, transport) == []


@pytest.mark.parametrize(
    "handle, field, received",
    [
        ("not base64!", "raw_handle.b64 is not base64", "not base64!"),
        (base64.b64encode(bytes(10)).decode(), "raw_handle. Expected the 64 bytes", "10 bytes"),
    ],
)
def test_a_malformed_handle_over_http_is_400_naming_the_field(clients, handle, field, received):
    with pytest.raises(InferenceServerException, match=r"\[400\]") as caught:
        clients["http"].register_cuda_shared_memory("gpu0", handle, 0, 64)
    assert field in str(caught.value) and received in str(caught.value)


def test_a_handle_of_the_wrong_size_over_grpc_is_invalid_argument_naming_raw_handle(clients):
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT") as caught:
        clients["grpc"].register_cuda_shared_memory("gpu0", base64.b64encode(bytes(63)), 0, 64)
    assert "raw_handle. Expected the 64 bytes of a cudaIpcMemHandle_t. Received: '63 bytes'" in str(caught.value)


@pytest.mark.parametrize(
    "body, named",
    [
        ({"device_id": 0, "byte_size": 64}, 'raw_handle. Expected {"b64"'),
        ({"raw_handle": HANDLE.decode(), "device_id": 0, "byte_size": 64}, 'raw_handle. Expected {"b64"'),
        ({"raw_handle": {"b64": HANDLE.decode()}, "byte_size": 64}, "device_id. Expected a whole number >= 0"),
        ({"raw_handle": {"b64": HANDLE.decode()}, "device_id": -1, "byte_size": 64}, "device_id"),
        ({"raw_handle": {"b64": HANDLE.decode()}, "device_id": 0, "byte_size": 0}, "byte_size. Expected a whole"),
    ],
)
def test_a_registration_body_missing_or_bad_in_one_field_names_it(server, body, named):
    status, error = _post(server, "/v2/cudasharedmemory/region/gpu0/register", body)
    assert status == 400 and named in error, error


def test_a_name_held_by_system_shared_memory_is_refused_for_cuda(clients):
    import tritonclient.utils.shared_memory as shm

    client = clients["http"]
    region = shm.create_shared_memory_region("taken", "/xdevice_test_cuda_taken", 64)
    try:
        client.register_system_shared_memory("taken", "/xdevice_test_cuda_taken", 64)
        with pytest.raises(InferenceServerException, match="'taken' is already registered as system shared memory"):
            clients["grpc"].register_cuda_shared_memory("taken", HANDLE, 0, 64)
    finally:
        client.unregister_system_shared_memory("taken")
        shm.destroy_shared_memory_region(region)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_status_of_an_unknown_region_is_not_found_and_unregistering_it_is_a_no_op(clients, transport):
    client = clients[transport]
    with pytest.raises(InferenceServerException, match="Unknown CUDA shared-memory region") as caught:
        client.get_cuda_shared_memory_status("nowhere")
    assert ("[404]" in str(caught.value)) if transport == "http" else ("NOT_FOUND" in str(caught.value))
    client.unregister_cuda_shared_memory("nowhere")
    client.unregister_cuda_shared_memory()
    assert _regions(client, transport) == []


def test_the_server_lists_cuda_shared_memory_only_where_a_model_runs_on_a_gpu(clients):
    extensions = clients["http"].get_server_metadata()["extensions"]
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions


# -- finding and loading the CUDA runtime ------------------------------------------------------


def test_no_cuda_runtime_anywhere_is_refused_naming_libcudart_and_where_it_looked():
    with pytest.raises(RuntimeMissing, match=r"libcudart\) is not found: none is loaded in this process"):
        CudaRuntime.find([])


def test_a_library_that_is_not_the_cuda_runtime_is_named_with_why_it_failed(tmp_path):
    fake = tmp_path / "libcudart.so.13"
    fake.write_bytes(b"not a shared object")
    libc = ctypes.util.find_library("c")  # a real library, loads, and has no CUDA calls
    assert libc is not None
    with pytest.raises(RuntimeMissing) as caught:
        CudaRuntime.find([str(fake), libc])
    text = str(caught.value)
    assert text.startswith("no CUDA runtime library (libcudart) loads here")
    assert f"{fake}: " in text and f"{libc}: " in text and "cudaIpcOpenMemHandle" in text


def test_a_registration_with_no_cuda_runtime_names_the_region_and_the_fix():
    from xdevice.serving.protocol import BadRequest

    regions = CudaSharedMemory(runtime=lambda: CudaRuntime.find([]))
    with pytest.raises(
        BadRequest, match=r"CUDA shared memory \(region 'in'\) is not available: the CUDA runtime "
    ) as no:
        regions.register("in", bytes(64), 0, 64)
    assert no.value.status == 400 and "Fix: register system shared memory instead" in str(no.value)
    assert regions.status() == []


def test_the_runtime_is_looked_for_in_the_process_then_the_nvidia_wheels(tmp_path):
    for folder in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "nvidia/cu13/lib/libcudart.so.13").touch()
    (tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12").touch()
    maps = "7f00-7f10 r-xp 00000000 08:01 42 /opt/ort/lib/libcudart.so.13.0.96\n7f10-7f20 r-xp 0 0:0 0 [vdso]\n"
    assert cudart_candidates([tmp_path], maps=maps) == [
        "/opt/ort/lib/libcudart.so.13.0.96",
        str(tmp_path / "nvidia/cu13/lib/libcudart.so.13"),
        str(tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12"),
    ]


# -- the session's side: device memory known by its pointer ------------------------------------


@pytest.fixture(scope="module")
def cpu_session(repository):
    from xdevice.serving import Session

    return Session(repository / "dense" / "1" / "model.onnx", "cpu")


def test_an_input_in_gpu_memory_is_refused_by_a_session_on_the_cpu(cpu_session):
    from xdevice import InferenceError
    from xdevice._device import Device
    from xdevice.serving.iobinding import DevicePointer

    on_gpu = DevicePointer(0x7F0000000000, Device("gpu", 0), "float32", (2, 4))
    with pytest.raises(InferenceError, match="Input 'x' lies in GPU memory of another device") as caught:
        cpu_session.check_inputs({"x": on_gpu})
    assert "Expected memory on cpu:0. Received: 'gpu:0'" in str(caught.value)


def test_a_session_on_the_cpu_cannot_leave_outputs_on_a_gpu(cpu_session):
    import numpy as np

    from xdevice import InferenceError

    feeds = cpu_session.check_inputs({"x": np.ones((2, 4), np.float32)})
    with pytest.raises(InferenceError, match=r"cannot leave outputs \['y'\] in GPU memory"):
        cpu_session.run_checked(feeds, on_device=["y"])
    assert cpu_session.run_checked(feeds)["y"].shape == (2, 3)  # the same feeds, on the host: runs


def test_a_negative_device_id_over_grpc_is_invalid_argument_naming_device_id(clients):
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT") as caught:
        clients["grpc"].register_cuda_shared_memory("gpu0", HANDLE, -1, 64)
    assert "device_id. Expected a whole number >= 0. Received: -1" in str(caught.value)
