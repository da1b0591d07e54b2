"""The xdevice command line."""

import json
import subprocess
import sys

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


def test_devices_table_has_one_column_per_framework():
    result = _run("devices")
    header = result.stdout.splitlines()[0].split()
    assert header[:2] == ["DEVICE", "NAME"] and header[-len(xdevice.backends()):] == xdevice.backends()
    assert result.stdout.splitlines()[1].startswith("cpu:0")


def test_devices_machine_only_starts_no_framework():
    result = _run("devices", "--machine", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)[0]["device"] == "cpu:0"


def test_an_unknown_command_is_a_usage_error():
    result = _run("devises")
    assert result.returncode == 2 and "invalid choice: 'devises'" in result.stderr
