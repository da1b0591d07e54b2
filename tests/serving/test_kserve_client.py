"""KServe's own clients (the ``kserve`` package's ``InferenceRESTClient`` and
``InferenceGRPCClient``, unmodified, from its virtualenv under .peers/: ``make peers``) against
``xdevice serve`` on loopback: liveness, readiness, model readiness and infer, over HTTP and gRPC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .onnx_models import B, W, dense_model, write_model

KSERVE_PYTHON = Path(__file__).resolve().parents[2] / ".peers" / "kserve" / "bin" / "python"

CLIENT = """
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

http, grpc = sys.argv[1], sys.argv[2]
x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def request():
    tensor = InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    return InferRequest(model_name="dense", infer_inputs=[tensor], request_id="k1")


async def main():
    found = {}
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=1, timeout=30))
    url = f"http://{http}"
    found["rest"] = {
        "live": await rest.is_server_live(url),
        "ready": await rest.is_server_ready(url),
        "model_ready": await rest.is_model_ready(url, "dense"),
    }
    answer = await rest.infer(url, request(), model_name="dense")
    found["rest"]["outputs"] = {o.name: o.as_numpy().tolist() for o in answer.outputs}
    await rest.close()
    rpc = InferenceGRPCClient(grpc, retries=2)
    found["grpc"] = {
        "live": await rpc.is_server_live(),
        "ready": await rpc.is_server_ready(),
        "model_ready": await rpc.is_model_ready("dense"),
    }
    answer = await rpc.infer(request())
    found["grpc"]["outputs"] = {o.name: o.as_numpy().tolist() for o in answer.outputs}
    await rpc.close()
    print(json.dumps(found))


asyncio.run(main())
"""


@pytest.mark.realworld  # needs KServe's virtualenv (make test-models runs make peers first)
def test_kserves_rest_and_grpc_clients_pass_health_readiness_and_infer(tmp_path):
    if not KSERVE_PYTHON.exists():
        pytest.skip(f"KServe's virtualenv is not set up ({KSERVE_PYTHON}): make peers")
    pytest.importorskip("starlette")
    from xdevice.serving import ServerProcess

    write_model(tmp_path, "dense", dense_model())
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    with ServerProcess(tmp_path, timeout=120) as server:
        done = subprocess.run(
            [str(KSERVE_PYTHON), str(script), server.url, server.grpc_url],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    for transport in ("rest", "grpc"):
        got = found[transport]
        assert (got["live"], got["ready"], got["model_ready"]) == (True, True, True), transport
        np.testing.assert_allclose(got["outputs"]["y"], np.maximum(x @ W + B, 0), rtol=1e-6, err_msg=transport)
        np.testing.assert_allclose(got["outputs"]["total"], x.sum(axis=1), rtol=1e-6, err_msg=transport)
