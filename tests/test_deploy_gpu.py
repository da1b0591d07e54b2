"""The GPU install and the GPU deployment agree on one CUDA major: constraints/gpu.txt pins CUDA
builds of one major, the Makefile installs nothing of another, deploy/Dockerfile.cuda starts from
NVIDIA's image of that major, and the KServe GPU runtime runs that image on a GPU it requests.

Two CUDA majors in one process fail at load time or need a driver the machine lacks; none of
these files is read by a CPU test run, so these checks are what keeps them honest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

# Packages whose version is the CUDA toolkit's own (13.0.96 is CUDA 13); the other nvidia-* libraries
# (cuBLAS, cuFFT, ...) have their own numbering and carry the major in their name where it matters.
TOOLKIT_VERSIONED = re.compile(r"^(cuda-toolkit|cuda-bindings|nvidia-cuda-.+|nvidia-nvjitlink|nvidia-nvvm)$")
# A CUDA build named by its major: nvidia-cudnn-cu13, jax-cuda13-plugin, jax[cuda13].
MAJOR_IN_NAME = re.compile(r"(?:-cu|cuda)(\d+)(?:-|$)")
# Extras that install a CUDA build without naming its major, and the major they install:
# tensorflow[and-cuda] 2.21 requires nvidia-*-cu12 (its wheel's Requires-Dist).
UNNAMED_CUDA_EXTRAS = {("tensorflow", "and-cuda"): 12}


def canonical(name: str) -> str:
    """A package name as pip compares them (PEP 503): tensorflow_cpu and tensorflow-cpu are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(name: str) -> dict[str, str]:
    """``package==version`` lines of constraints/<name>.txt, by canonical package name."""
    found = {}
    for line in (ROOT / "constraints" / f"{name}.txt").read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            package, _, version = requirement.partition("==")
            assert version, f"constraints/{name}.txt: {line!r} is not a package==version pin"
            found[canonical(package)] = version
    return found


def cuda_majors(package: str, version: str = "") -> set[int]:
    """The CUDA majors a pinned package belongs to: from its name, or from a toolkit version."""
    majors = {int(n) for n in MAJOR_IN_NAME.findall(package)}
    if TOOLKIT_VERSIONED.match(package):
        majors.add(int(version.split(".")[0]))
    return majors


def gpu_cuda_major() -> int:
    majors = {major for package, version in pins("gpu").items() for major in cuda_majors(package, version)}
    assert len(majors) == 1, f"constraints/gpu.txt mixes CUDA majors {sorted(majors)}; pick one"
    return majors.pop()


def makefile_gpu_frameworks() -> list[str]:
    [line] = [line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("FRAMEWORKS_gpu")]
    return line.partition(":=")[2].split()


def docker_build_tag(dockerfile: str) -> str:
    """The image name a Dockerfile's own `docker build ... -t NAME .` comment gives it."""
    text = (DEPLOY / dockerfile).read_text()
    return re.search(rf"docker build -f deploy/{re.escape(dockerfile)} -t (\S+)", text).group(1)


def runtime(name: str) -> dict:
    return yaml.safe_load((DEPLOY / "kserve" / name).read_text())


def test_a_cuda_build_is_told_by_its_name_or_its_toolkit_version():
    assert cuda_majors("nvidia-cublas-cu12", "12.5.3.2") == {12}
    assert cuda_majors("jax-cuda13-plugin", "0.10.2") == {13}
    assert cuda_majors("cuda13") == {13}  # jax's extra
    assert cuda_majors("nvidia-cuda-runtime", "13.0.96") == {13}
    assert cuda_majors("nvidia-cufft", "12.0.0.61") == set()  # cuFFT's own numbering, not CUDA's
    assert cuda_majors("onnxruntime-gpu", "1.31.1") == set()


def test_the_gpu_constraints_pin_every_framework_s_cuda_build_in_one_major():
    major = gpu_cuda_major()
    assert {"torch", "onnxruntime-gpu", f"jax-cuda{major}-plugin", f"nvidia-cudnn-cu{major}"} <= pins("gpu").keys()


def test_the_gpu_constraints_pin_the_same_versions_as_the_cpu_ones():
    gpu, cpu = pins("gpu"), pins("cpu")
    differing = {package: (gpu[package], cpu[package]) for package in gpu.keys() & cpu.keys()}
    assert {package: pair for package, pair in differing.items() if pair[0] != pair[1]} == {}
    assert {"torch", "jax", "tensorflow-cpu", "onnx"} <= differing.keys()  # the frameworks are compared


def test_the_makefile_installs_on_a_gpu_only_what_gpu_txt_pins_in_its_cuda_major():
    major, pinned = gpu_cuda_major(), pins("gpu")
    for requirement in makefile_gpu_frameworks():
        package, _, extras = requirement.rstrip("]").partition("[")
        package = canonical(package)
        assert package in pinned, f"the Makefile installs {requirement} on a GPU, unpinned in constraints/gpu.txt"
        for extra in filter(None, extras.split(",")):
            majors = cuda_majors(extra) or {UNNAMED_CUDA_EXTRAS.get((package, extra), major)}
            assert majors == {major}, f"{requirement} installs CUDA {sorted(majors)} beside CUDA {major}"


def test_the_cuda_image_is_nvidias_runtime_with_cudnn_of_the_same_major():
    lines = (DEPLOY / "Dockerfile.cuda").read_text().splitlines()
    [base] = [line.split()[1] for line in lines if line.startswith("FROM")]
    found = re.fullmatch(r"nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-runtime-ubuntu[\d.]+", base)
    assert found, f"deploy/Dockerfile.cuda starts from {base}, not NVIDIA's CUDA runtime with cuDNN"
    assert int(found.group(1)) == gpu_cuda_major()  # onnxruntime-gpu loads this image's libcudart


def test_the_gpu_serving_runtime_runs_the_cuda_image_on_a_gpu_it_requests():
    cpu, gpu = runtime("servingruntime.yaml"), runtime("servingruntime-gpu.yaml")
    [cpu_container], [gpu_container] = cpu["spec"]["containers"], gpu["spec"]["containers"]
    assert gpu_container["image"] == docker_build_tag("Dockerfile.cuda")
    assert str(gpu_container["resources"]["limits"].get("nvidia.com/gpu")) == "1"
    assert cpu_container["image"] == docker_build_tag("Dockerfile")
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]
    assert gpu["metadata"]["name"] != cpu["metadata"]["name"]
    # one runtime is picked for an onnx model that names none: the CPU one
    assert [f["autoSelect"] for f in cpu["spec"]["supportedModelFormats"]] == [True]
    assert [f["autoSelect"] for f in gpu["spec"]["supportedModelFormats"]] == [False]


def test_the_gpu_serving_runtime_serves_as_the_cpu_one_does():
    """tests/serving/test_deploy.py checks the CPU runtime's command, ports and probes against the
    CLI; the GPU runtime differs only in what places it on a GPU."""
    cpu, gpu = runtime("servingruntime.yaml"), runtime("servingruntime-gpu.yaml")
    placement = {"image", "resources"}
    [cpu_container], [gpu_container] = cpu["spec"]["containers"], gpu["spec"]["containers"]
    assert {k: v for k, v in gpu_container.items() if k not in placement} == {
        k: v for k, v in cpu_container.items() if k not in placement
    }
    shared = {"annotations", "protocolVersions"}
    assert {k: gpu["spec"][k] for k in shared} == {k: cpu["spec"][k] for k in shared}
