"""The xdevice command line."""

import json
import os
import subprocess
import sys

import pytest

import xdevice


def _run(*args):
    return subprocess.run([sys.executable, "-m", "xdevice", *args], capture_output=True, text=True, timeout=300)


def test_devices_json_lists_the_cpu_and_who_sees_it():
    result = _run("devices", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    cpu = next(r for r in rows if r["device"] == "cpu:0")
    assert set(cpu["backends"]) == set(xdevice.backends())
    assert len([r for r in rows if r["kind"] == "gpu"]) == len(xdevice.devices(kind="gpu"))


def test_devices_table_has_one_column_per_framework_and_nothing_on_stderr():
    result = _run("devices")  # every framework starts: their start-up chatter is hidden (tests/test_quiet.py)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    header = result.stdout.splitlines()[0].split()
    assert header[:2] == ["DEVICE", "NAME"] and header[-len(xdevice.backends()) :] == xdevice.backends()
    assert result.stdout.splitlines()[1].startswith("cpu:0")


def test_devices_machine_only_starts_no_framework():
    result = _run("devices", "--machine", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)[0]["device"] == "cpu:0"


def test_an_unknown_command_is_a_usage_error():
    result = _run("devises")
    assert result.returncode == 2 and "invalid choice: 'devises'" in result.stderr


def test_version_prints_the_installed_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"xdevice {xdevice.__version__}"


def test_an_opset_the_installed_onnx_does_not_know_is_a_usage_error_before_any_export():
    from onnx.defs import onnx_opset_version

    result = _run("export", "mlp", "--backend", "torch", "--opset", "99")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"expected an ONNX opset from 7 to {onnx_opset_version()}" in result.stderr and "got '99'" in result.stderr


def test_launching_a_missing_script_says_so_once_and_starts_nothing(tmp_path):
    result = _run("launch", "--nproc-per-node", "2", str(tmp_path / "missing.py"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("No training script at that path") == 1 and "can't open file" not in result.stderr


def test_long_commands_say_what_they_are_doing_on_stderr_and_keep_stdout_clean():
    """Off a terminal, progress is one plain line per step (a terminal gets a tqdm bar)."""
    result = _run("parity", "--models", "mlp", "cnn", "--backends", "numpy", "--json")
    assert result.returncode == 0, result.stderr
    assert "parity: mlp (1/2)" in result.stderr and "parity: cnn (2/2)" in result.stderr
    json.loads(result.stdout)  # nothing but the report on stdout


@pytest.mark.parametrize("command", [["export", "mlp", "--backend"], ["convert", "m.onnx", "--to"]])
def test_a_backend_alias_on_the_command_line_names_the_backend_meant(command):
    result = _run(*command, "tf")
    assert result.returncode == 2 and "invalid choice" not in result.stderr
    assert "Did you mean 'tensorflow'? Fix: give 'tensorflow'" in result.stderr


def test_exporting_from_numpy_is_refused_by_xdevice_with_the_reason_not_by_argparse(tmp_path):
    result = _run("export", "mlp", "--backend", "numpy", "--output", str(tmp_path / "mlp.onnx"))
    assert result.returncode == 2 and "invalid choice" not in result.stderr and "Traceback" not in result.stderr
    assert "ConversionError: numpy has no ONNX exporter" in result.stderr and "Valid choices: torch" in result.stderr
    assert not (tmp_path / "mlp.onnx").exists()


def test_a_backend_registered_through_the_entry_point_is_a_choice_wherever_a_builtin_one_is(tmp_path):
    """A third-party distribution registers ``nosuchframework``; its framework is not installed."""
    dist = tmp_path / "xdevice_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: xdevice-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[xdevice.backends]\nnosuchframework = xdevice.backends.numpy:NumpyBackend\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "xdevice", *args], capture_output=True, text=True, env=env)

    for command in ("export", "convert", "estimate-memory"):
        assert "nosuchframework" in run(command, "--help").stdout, command
    result = run("export", "mlp", "--backend", "nosuchframework")
    assert result.returncode == 2 and "invalid choice" not in result.stderr
    assert "BackendUnavailable" in result.stderr and "Fix: pip install nosuchframework" in result.stderr
