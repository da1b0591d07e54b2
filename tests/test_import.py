"""`import xdevice` imports no framework (DESIGN.md rule 1)."""

import json

FRAMEWORKS = ["numpy", "torch", "jax", "jaxlib", "tensorflow", "keras", "onnx", "onnxruntime"]


def test_import_xdevice_imports_no_framework(run_python):
    result = run_python(f"""
        import json, sys
        import xdevice
        xdevice.backends()          # listing backends must not import them either
        xdevice.device("cuda:1")    # nor must parsing a device name
        print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_training_and_serving_load_on_first_use(run_python):
    result = run_python("""
        import json, sys
        import xdevice
        before = [m for m in ("xdevice.training", "xdevice.serving.server") if m in sys.modules]
        xdevice.fit, xdevice.Trainer
        print(json.dumps([before, "xdevice.training.trainer" in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], True]


def test_an_installed_copy_does_not_widen_the_package_path(run_python):
    result = run_python("import json, xdevice; print(json.dumps(list(xdevice.__path__)))")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 1  # no repository root: tests/, examples/ stay out of xdevice


def test_machine_discovery_imports_no_framework(run_python):
    result = run_python(f"""
        import json, sys
        import xdevice
        xdevice.devices()
        print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_a_source_checkout_imports_with_nothing_installed():
    """`python -S` (no site-packages: no install, no editable finder) with the repository root
    on sys.path still finds xdevice.backends and xdevice.converters in backends/, converters/
    (xdevice/backends and xdevice/converters are links to them)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys, importlib.util; sys.path.insert(0, sys.argv[1]); import xdevice, xdevice.backends.base; "
        "print(xdevice.backends.__file__, importlib.util.find_spec('xdevice.converters').origin); "
        "print([n for n in ('tests', 'examples', 'benchmarks') if importlib.util.find_spec('xdevice.' + n)])"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code, str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found, others = done.stdout.strip().splitlines()
    backends, converters = found.split()
    # through the links xdevice/backends and xdevice/converters: the top-level folders' files
    assert Path(backends).resolve() == root / "backends" / "__init__.py"
    assert Path(converters).resolve() == root / "converters" / "__init__.py"
    assert others == "[]"  # only backends/ and converters/ are mapped into the package
