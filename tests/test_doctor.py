"""xdevice doctor: each judgement from facts, and the real command on this machine."""

import json
import subprocess
import sys

from xdevice._doctor import export_tools, gpu_findings, onnxruntime_conflict, provider_findings


def test_both_onnxruntime_packages_installed_is_a_problem_with_the_fix():
    [finding] = onnxruntime_conflict({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"})
    assert not finding.ok
    assert finding.fix == "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu"


def test_one_onnxruntime_package_is_fine():
    assert all(f.ok for f in onnxruntime_conflict({"onnxruntime-gpu": "1.31.1"}))


def test_cuda_listed_but_running_on_cpu_is_a_problem():
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    findings = provider_findings(
        listed, {"CUDAExecutionProvider": ["CPUExecutionProvider"], "CPUExecutionProvider": ["CPUExecutionProvider"]}
    )
    cuda = [f for f in findings if "CUDAExecutionProvider" in f.text]
    assert len(cuda) == 1 and not cuda[0].ok and "did not load" in cuda[0].text and cuda[0].fix


def test_cuda_that_really_loads_is_fine():
    listed = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    findings = provider_findings(listed, {"CUDAExecutionProvider": listed, "CPUExecutionProvider": listed[1:]})
    assert all(f.ok for f in findings)


def test_a_gpu_build_that_sees_no_gpu_is_a_problem():
    [finding] = gpu_findings(2, {"torch": 0}, {"torch": True})
    assert not finding.ok and "GPU build but sees none" in finding.text


def test_a_cpu_build_on_a_gpu_machine_is_a_problem():
    [finding] = gpu_findings(1, {"tensorflow": 0}, {"tensorflow": False})
    assert not finding.ok and "CPU-only build" in finding.text


def test_no_gpu_at_all_is_healthy():
    assert all(f.ok for f in gpu_findings(0, {"torch": 0}, {"torch": False}))


def test_the_doctor_command_checks_this_machine():
    result = subprocess.run(
        [sys.executable, "-m", "xdevice", "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["healthy"] else 1)
    texts = [f["text"] for f in report["findings"]]
    assert any(t.startswith("numpy ") and "sees cpu:0" in t for t in texts)
    assert any("CPUExecutionProvider loads and runs" in t for t in texts)


def test_the_export_tools_are_reported_with_their_versions_or_how_to_install_them():
    findings = export_tools({"onnx": "1.23.2", "tf2onnx": "1.17.0"})
    texts = [f.text for f in findings]
    assert texts[0].startswith("onnx 1.23.2") and texts[2].startswith("tf2onnx 1.17.0")
    assert "onnxscript: not installed" in texts[1] and "pip install 'xdevice[export]'" in texts[3]
