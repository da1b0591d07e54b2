"""Triton's CUDA shared memory on a GPU server: a client process allocates device memory,
registers its IPC handles over HTTP and gRPC (unmodified tritonclient), and ``xdevice serve``
reads the input from the region by IO binding and writes the output into the other region; the
output read back from the device matches ``Session.run``. The refusals where no GPU serves are
tests/serving/test_cuda_shared_memory.py."""

from __future__ import annotations

import base64
import ctypes

import numpy as np
import pytest

from .conftest import needs, needs_ort_gpu

pytestmark = pytest.mark.gpu

_TO_DEVICE, _TO_HOST = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


class DeviceBuffer:
    """``size`` bytes of device memory this (client) process owns, through the CUDA runtime:
    what ``tritonclient.utils.cuda_shared_memory`` does, without needing cuda-python."""

    def __init__(self, cudart: ctypes.CDLL, size: int, device: int):
        self.cudart, self.size = cudart, size
        self.pointer = ctypes.c_void_p()
        _ok(cudart.cudaSetDevice(device), "cudaSetDevice")
        _ok(cudart.cudaMalloc(ctypes.byref(self.pointer), ctypes.c_size_t(size)), "cudaMalloc")

    def handle(self) -> bytes:
        """The region's ``cudaIpcMemHandle_t`` in base64, as ``get_raw_handle`` gives it."""
        raw = (ctypes.c_char * 64)()
        _ok(self.cudart.cudaIpcGetMemHandle(ctypes.byref(raw), self.pointer), "cudaIpcGetMemHandle")
        return base64.b64encode(raw.raw)

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        target = ctypes.c_void_p(self.pointer.value + offset)
        _ok(self.cudart.cudaMemcpy(target, data.ctypes.data_as(ctypes.c_void_p), data.nbytes, _TO_DEVICE), "cudaMemcpy")

    def read(self, dtype, shape, offset: int = 0) -> np.ndarray:
        out = np.empty(shape, dtype)
        source = ctypes.c_void_p(self.pointer.value + offset)
        _ok(self.cudart.cudaMemcpy(out.ctypes.data_as(ctypes.c_void_p), source, out.nbytes, _TO_HOST), "cudaMemcpy")
        return out

    def free(self) -> None:
        self.cudart.cudaFree(self.pointer)


def _ok(status: int, call: str) -> None:
    assert status == 0, f"{call} failed with CUDA error {status}"


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime the client side allocates with (skipped, named, where there is none)."""
    from xdevice.serving.cuda_memory import cudart_candidates

    for path in cudart_candidates():
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        library.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return library
    pytest.skip("needs the CUDA runtime library (libcudart), not found here (pip install onnxruntime-gpu[cuda,cudnn])")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_inputs_and_outputs_in_cuda_shared_memory_match_session_run(tmp_path, gpu_device, transport):
    needs("onnx", "starlette", "uvicorn", "grpc", "tritonclient")
    needs_ort_gpu()
    cudart = _cudart()
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from tests.serving.onnx_models import dense_model, write_model
    from xdevice.serving import Session
    from xdevice.serving.server import ServerProcess

    write_model(tmp_path, "dense", dense_model(), versions=(1,))
    model = tmp_path / "dense" / "1" / "model.onnx"
    x = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
    expected = Session(model, str(gpu_device)).run({"x": x})
    y = expected["y"]
    index = gpu_device.index
    module = httpclient if transport == "http" else grpcclient
    inputs, outputs = DeviceBuffer(cudart, x.nbytes, index), DeviceBuffer(cudart, y.nbytes + 64, index)
    with ServerProcess(tmp_path, options=["--device", str(gpu_device)]) as server:
        client = module.InferenceServerClient(server.url if transport == "http" else server.grpc_url)
        try:
            inputs.write(x)
            outputs.write(np.zeros(y.size + 16, np.float32))
            client.register_cuda_shared_memory("in", inputs.handle(), index, x.nbytes)
            client.register_cuda_shared_memory("out", outputs.handle(), index, y.nbytes + 64)
            status = client.get_cuda_shared_memory_status()
            found = (
                {r["name"]: (r["device_id"], r["byte_size"]) for r in status}
                if transport == "http"
                else {n: (r.device_id, r.byte_size) for n, r in status.regions.items()}
            )
            assert found == {"in": (index, x.nbytes), "out": (index, y.nbytes + 64)}

            tensor = module.InferInput("x", list(x.shape), "FP32")
            tensor.set_shared_memory("in", x.nbytes)
            wanted = module.InferRequestedOutput("y")
            wanted.set_shared_memory("out", y.nbytes, offset=64)
            result = client.infer("dense", [tensor], outputs=[wanted, module.InferRequestedOutput("total")])
            np.testing.assert_allclose(outputs.read(np.float32, y.shape, offset=64), y, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(result.as_numpy("total"), expected["total"], rtol=1e-5, atol=1e-6)
            assert outputs.read(np.float32, (16,)).tolist() == [0.0] * 16  # nothing written before the offset

            small = module.InferRequestedOutput("y")
            small.set_shared_memory("out", y.nbytes, offset=128)  # past the region's end
            with pytest.raises(InferenceServerException, match="does not fit shared-memory region 'out'"):
                client.infer("dense", [tensor], outputs=[small])
            client.unregister_cuda_shared_memory("in")
            with pytest.raises(InferenceServerException, match="Unknown shared-memory region"):
                client.infer("dense", [tensor])
            assert "cuda_shared_memory" in (
                client.get_server_metadata()["extensions"]
                if transport == "http"
                else client.get_server_metadata().extensions
            )
        finally:
            client.unregister_cuda_shared_memory()
            client.close()
            inputs.free()
            outputs.free()
