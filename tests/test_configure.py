"""configure(): applied before a runtime starts, refused clearly after, validated always
(what waits for a framework not imported yet: tests/test_pending_configuration.py).

Each case runs in a fresh interpreter: the test process itself configured its backends at
start-up (xdevice_cpu_devices = 4) and their runtimes are running.
"""

import json

import pytest

import xdevice
from xdevice import ConfigurationError, DeviceNotFound


def test_cpu_devices_take_effect_in_a_fresh_process(backend, run_python):
    result = run_python(f"""
        import json, xdevice
        report = xdevice.configure(cpu_devices=3, backends=[{backend.name!r}])
        cpus = xdevice.devices(kind="cpu", backend={backend.name!r})
        print(json.dumps({{"how": report.how({backend.name!r}, "cpu_devices"),
                          "cpus": [str(d) for d in cpus]}}))
    """)
    if backend.name == "numpy":
        assert "ConfigurationError" in result.stderr and "single CPU device" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    if backend.supports_virtual_devices:
        assert out == {"how": "applied", "cpus": ["cpu:0", "cpu:1", "cpu:2"]}
    else:
        assert out == {"how": "advisory", "cpus": ["cpu:0"]}


def test_the_torch_cpu_devices_advisory_names_the_launcher(run_python):
    """PyTorch has no virtual CPUs: the report says how N replicas do run (as the Trainer's refusal does)."""
    if "torch" not in xdevice.backends():
        pytest.skip("torch is not installed")
    result = run_python("""
        import xdevice
        print(xdevice.configure(cpu_devices=3, backends=["torch"]))
    """)
    assert result.returncode == 0, result.stderr
    assert "advisory" in result.stdout
    assert "`xdevice launch --nproc-per-node 3 your_script.py`" in result.stdout
    assert "without devices=" in result.stdout


def test_configuring_after_the_runtime_started_names_the_framework_and_the_fix(started_runtime, run_python):
    name, start = started_runtime
    result = run_python(f"""
        import xdevice
        {start}
        try:
            xdevice.configure(cpu_devices=2, backends=[{name!r}])
        except xdevice.ConfigurationError as error:
            print(error)
    """)
    title = xdevice.backend(name).title
    assert f"{title} already started" in result.stdout, result.stderr
    assert "Fix: call xdevice.configure(...) at the top of your program" in result.stdout


def test_the_same_settings_again_after_start_are_accepted(run_python):
    result = run_python("""
        import xdevice
        first = xdevice.configure(cpu_devices=2, backends=["jax"])
        import jax.numpy as jnp; jnp.ones(1).block_until_ready()
        again = xdevice.configure(cpu_devices=2, backends=["jax"])
        print(list(first) == list(again))
    """)
    assert result.stdout.strip() == "True", result.stderr


def test_a_global_configure_reports_every_backend(run_python):
    result = run_python("""
        import importlib, json, xdevice
        for name in xdevice.backends():  # imported first: each is configured at once, not pending
            importlib.import_module(name)
        report = xdevice.configure(cpu_devices=2, memory_limit="1GiB", memory_growth=True)
        print(json.dumps([[a.backend, a.setting, a.how] for a in report]))
    """)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {b for b, _, _ in rows} == set(xdevice.backends())
    assert ["numpy", "cpu_devices", "unsupported"] in rows
    assert [row for row in rows if row[2] == "pending"] == []
    if not xdevice.devices(kind="gpu"):
        assert all(how == "skipped" for b, s, how in rows if s.startswith("memory") and b != "numpy")


@pytest.mark.parametrize(
    "settings, fragment",
    [
        (dict(memory_limit=-5), "memory_limit must be positive"),
        (dict(memory_limit=0.5), "must be a number of bytes"),
        (dict(memory_limit="lots"), "memory_limit is not a size"),
        (dict(memory_limit="4 GiBs"), r"unknown unit 'gibs'.*Fix: write e.g. memory_limit='4GiB'"),
        (
            dict(memory_limit="-1GB"),
            r"memory_limit must be positive\. Expected more than 0 bytes\. Received: '-1GB'\. Fix",
        ),
        (dict(memory_limit="1e400GB"), "memory_limit is larger than any machine's memory"),
        (dict(memory_growth="yes"), "memory_growth must be True or False"),
        (dict(cpu_devices=0), "cpu_devices is the number of virtual CPU devices"),
        (dict(cpu_devices="4"), "cpu_devices is the number of virtual CPU devices"),
        (dict(visible=["cpu:0"]), "CPUs are always visible"),
    ],
)
def test_nonsense_settings_are_refused_before_anything_is_applied(settings, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        xdevice.configure(**settings, backends=["numpy"])


def test_a_visible_gpu_that_does_not_exist_is_refused():
    missing = len(xdevice.devices(kind="gpu"))
    with pytest.raises(DeviceNotFound, match="visible names GPUs that do not exist"):
        xdevice.configure(visible=[f"gpu:{missing}"], backends=["numpy"])


def test_memory_limits_parse_units():
    from xdevice._types import parse_bytes

    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("2 GB") == 2 * 10**9
    assert parse_bytes(4096) == 4096


def test_the_report_shows_memory_limits_in_binary_units(run_python):
    result = run_python("""
        import xdevice
        print(xdevice.configure(memory_limit="8GiB", backends=["torch"]))
    """)
    assert result.returncode == 0, result.stderr
    assert "8.0 GiB" in result.stdout and "8589934592" not in result.stdout
