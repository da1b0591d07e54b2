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


def test_machine_discovery_imports_no_framework(run_python):
    result = run_python(f"""
        import json, sys
        import xdevice
        xdevice.devices()
        print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
