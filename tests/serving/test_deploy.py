"""The deployment recipes say what the command does: the container runs `xdevice serve` with
flags it accepts, and KServe's ports, probes and metrics point where the server answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from xdevice.cli import build_parser

yaml = pytest.importorskip("yaml")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def dockerfile(name: str) -> dict[str, list[str]]:
    """Each instruction's arguments (JSON form for ENTRYPOINT and CMD), continuation lines joined."""
    import json

    found: dict[str, list[str]] = {}
    for line in (DEPLOY / name).read_text().replace("\\\n", " ").splitlines():
        if line.strip() and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            rest = rest.strip()
            found.setdefault(keyword, []).append(json.loads(rest) if rest.startswith("[") else rest)
    return found


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_the_container_runs_xdevice_serve_with_flags_it_accepts(name):
    recipe = dockerfile(name)
    [entrypoint], [command] = recipe["ENTRYPOINT"], recipe["CMD"]
    assert entrypoint == ["xdevice", "serve"]
    args = build_parser().parse_args(["serve", *command])
    assert args.repository == "/models" and args.host == "0.0.0.0"
    assert sorted(recipe["EXPOSE"][0].split()) == sorted([str(args.port), str(args.grpc_port)])
    installs = " ".join(recipe["RUN"])
    assert '".[serve]"' in installs and ("onnxruntime-gpu" in installs) == name.endswith("cuda")
    assert any(step.startswith("10001") for step in recipe["USER"])  # not root


def test_the_serving_runtime_runs_the_command_on_the_ports_and_probes_it_declares():
    runtime = yaml.safe_load((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    spec = runtime["spec"]
    assert {"name": "onnx", "version": "1", "autoSelect": True} in spec["supportedModelFormats"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    [container] = spec["containers"]
    args = build_parser().parse_args(["serve", *container["args"]])
    assert args.repository == "/mnt/models" and args.host == "0.0.0.0"  # where KServe mounts the model
    assert [p["containerPort"] for p in container["ports"]] == [args.port]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": args.port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": args.port}
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(args.port)
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert args.grpc_port == 9000  # KServe's gRPC port for v2 runtimes


def test_the_inference_service_uses_the_runtime():
    service = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    runtime = yaml.safe_load((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    model = service["spec"]["predictor"]["model"]
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert model["runtime"] == runtime["metadata"]["name"] and model["modelFormat"]["name"] == "onnx"
    assert model["protocolVersion"] == "v2" and model["storageUri"]


def test_the_probed_paths_answer_on_a_running_server(server):
    import http.client

    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
        connection.request("GET", path)
        assert connection.getresponse().status == 200, path
        connection.close()
