"""configure() costs only what the program uses: a framework not imported yet is not imported
for it; its settings wait, reported as pending, and apply when it first loads, whoever imports
it. Each case runs in a fresh interpreter, since configuration is process-wide (and the test
process configured its backends at start-up)."""

import json

import pytest

import xdevice

#: framework -> what a program writes to count its CPU devices
CPU_COUNT = {
    "jax": "import jax; print(len(jax.devices('cpu')))",
    "tensorflow": "import tensorflow as tf; print(len(tf.config.list_logical_devices('CPU')))",
}
#: framework -> what a program writes to start its runtime
START = {
    "jax": "import jax.numpy as jnp; jnp.ones(1).block_until_ready()",
    "tensorflow": "import tensorflow as tf; tf.ones(1)",
}


def needs(*names):
    missing = [name for name in names if name not in xdevice.backends()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def test_configure_imports_no_framework_and_reports_each_setting_as_pending(run_python):
    result = run_python("""
        import json, sys, xdevice
        report = xdevice.configure(cpu_devices=4, memory_growth=True)
        imported = [m for m in ("numpy", "torch", "jax", "jaxlib", "tensorflow") if m in sys.modules]
        print(json.dumps([imported, [[a.backend, a.setting, a.how, a.detail] for a in report], str(report)]))
    """)
    assert result.returncode == 0, result.stderr
    imported, rows, printed = json.loads(result.stdout)
    assert imported == []
    assert sorted(rows) == sorted(
        [name, setting, "pending", f"applied when {name} is imported"]
        for name in xdevice.backends()
        for setting in ("cpu_devices", "memory_growth")
    )
    assert "pending  applied when tensorflow is imported" in printed or "tensorflow" not in xdevice.backends()


def test_a_torch_program_imports_neither_tensorflow_nor_jax(run_python):
    needs("torch")
    result = run_python("""
        import json, sys, xdevice
        xdevice.configure(cpu_devices=4)
        import torch
        torch.ones(2) + 1
        print(json.dumps([m for m in ("tensorflow", "jax", "jaxlib", "keras") if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("name", sorted(CPU_COUNT))
def test_a_framework_the_program_imports_later_sees_the_virtual_cpus(name, run_python):
    needs(name)
    result = run_python(f"""
        import xdevice
        xdevice.configure(cpu_devices=4)
        {CPU_COUNT[name]}
    """)
    assert result.stdout.strip() == "4", result.stderr


@pytest.mark.parametrize("name", sorted(CPU_COUNT))
def test_xdevice_first_use_of_a_framework_applies_what_waited(name, run_python):
    needs(name)
    result = run_python(f"""
        import json, xdevice
        xdevice.configure(cpu_devices=3)
        cpus = xdevice.devices(kind="cpu", backend={name!r})
        again = xdevice.configure(cpu_devices=3)
        print(json.dumps([[str(d) for d in cpus], again.how({name!r}, "cpu_devices")]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [["cpu:0", "cpu:1", "cpu:2"], "applied"]


def test_a_framework_already_imported_is_configured_at_once(run_python):
    needs("jax", "tensorflow")
    result = run_python("""
        import json, sys, xdevice
        import jax
        report = xdevice.configure(cpu_devices=2)
        print(json.dumps([report.how("jax", "cpu_devices"), report.how("tensorflow", "cpu_devices"),
                          "tensorflow" in sys.modules, len(jax.devices("cpu"))]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["applied", "pending", False, 2]


def test_new_settings_replace_those_still_pending(run_python):
    needs("jax")
    result = run_python(f"""
        import xdevice
        xdevice.configure(cpu_devices=4)
        xdevice.configure(cpu_devices=2)
        {CPU_COUNT["jax"]}
    """)
    assert result.stdout.strip() == "2", result.stderr


@pytest.mark.parametrize("name", sorted(START))
def test_new_settings_after_the_framework_started_name_it_and_the_fix(name, run_python):
    needs(name)
    result = run_python(f"""
        import xdevice
        xdevice.configure(cpu_devices=4)
        {START[name]}
        try:
            xdevice.configure(cpu_devices=2)
        except xdevice.ConfigurationError as error:
            print(error)
    """)
    assert f"{xdevice.backend(name).title} already started" in result.stdout, result.stderr
    assert "Fix: call xdevice.configure(...) at the top of your program" in result.stdout


def test_the_program_import_succeeds_with_a_warning_when_applying_fails(run_python):
    needs("jax")
    result = run_python("""
        import warnings, xdevice
        from xdevice import _configure
        xdevice.configure(cpu_devices=2)

        def broken(target):
            raise RuntimeError("no virtual CPUs today")

        _configure.apply_pending = broken
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import jax
        print(jax.__name__)
        print(*[w.message for w in caught if issubclass(w.category, RuntimeWarning)], sep="\\n")
    """)
    assert result.returncode == 0, result.stderr
    first, *messages = result.stdout.splitlines()
    assert first == "jax"
    (message,) = [m for m in messages if "recorded for JAX" in m]  # numpy, imported by jax, has its own
    assert "xdevice could not apply the settings configure() recorded for JAX as it loaded" in message
    assert "no virtual CPUs today" in message and "Fix: call xdevice.configure(...) again after `import jax`" in message


@pytest.mark.gpu
def test_a_pending_memory_limit_is_a_pool_when_the_program_imports_jax(run_python):
    needs("jax")
    result = run_python("""
        import xdevice
        xdevice.configure(memory_limit="2GiB", memory_growth=False)
        import jax
        print(jax.devices("gpu")[0].memory_stats()["bytes_limit"])
    """)
    assert abs(int(result.stdout) - 2 * 2**30) < 0.05 * 2**30, result.stderr  # XLA rounds the fraction


@pytest.mark.gpu
def test_a_pending_memory_limit_is_enforced_when_the_program_imports_torch(run_python):
    needs("torch")
    result = run_python("""
        import xdevice
        xdevice.configure(memory_limit="1GiB")
        import torch
        try:
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda:0")
            print("allocated past the limit")
        except torch.OutOfMemoryError:
            print("refused past the limit")
    """)
    assert result.stdout.strip() == "refused past the limit", result.stderr
