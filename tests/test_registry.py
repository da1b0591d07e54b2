"""The backend registry: entry points, lazy resolution, clear errors."""

import json
import textwrap

import pytest

import xdevice
from xdevice import BackendUnavailable


def test_the_four_builtin_backends_are_registered_through_entry_points():
    from importlib.metadata import entry_points

    registered = {ep.name for ep in entry_points(group="xdevice.backends")}
    assert {"numpy", "torch", "jax", "tensorflow"} <= registered
    assert set(xdevice.backends(all=True)) >= {"numpy", "torch", "jax", "tensorflow"}


def test_backend_is_resolved_once_and_cached():
    assert xdevice.backend("numpy") is xdevice.backend("numpy")


def test_backends_stays_callable_after_a_backend_package_is_imported():
    import xdevice.backends.numpy

    assert "numpy" in xdevice.backends()


def test_a_typo_in_a_backend_name_suggests_the_right_one():
    with pytest.raises(BackendUnavailable) as caught:
        xdevice.backend("tensorfow")
    assert "Did you mean 'tensorflow'?" in str(caught.value)
    assert "Valid choices: numpy, torch, jax, tensorflow" in str(caught.value)


@pytest.mark.parametrize(
    "typed, meant", [("tf", "tensorflow"), ("pytorch", "torch"), ("jnp", "jax"), ("jax.numpy", "jax"), ("np", "numpy")]
)
def test_a_backend_alias_people_type_is_suggested_with_the_fix(typed, meant):
    # one spelling, the import name: an alias is answered, not accepted as a second name
    with pytest.raises(BackendUnavailable) as caught:
        xdevice.backend(typed)
    said = str(caught.value)
    assert f"Did you mean {meant!r}?" in said
    assert f"Fix: pass {meant!r} ({typed!r} is its usual alias" in said


def test_a_device_given_as_a_backend_says_it_is_a_device():
    with pytest.raises(BackendUnavailable, match="'cuda' is a device, not a backend: pass device='cuda'"):
        xdevice.backend("cuda")


def test_a_registered_backend_without_its_framework_gives_the_pip_line(tmp_path, run_python):
    # A real third-party registration: a distribution on sys.path with an entry point.
    dist = tmp_path / "xdevice_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: xdevice-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[xdevice.backends]\nnosuchframework = xdevice.backends.numpy:NumpyBackend\n"
    )
    result = run_python(
        textwrap.dedent("""
        import json, xdevice
        out = {"installed": xdevice.backends(), "all": xdevice.backends(all=True)}
        try:
            xdevice.backend("nosuchframework")
        except xdevice.BackendUnavailable as error:
            out["error"] = str(error)
        print(json.dumps(out))
    """),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert "nosuchframework" in out["all"] and "nosuchframework" not in out["installed"]
    assert "not installed" in out["error"] and "Fix: pip install nosuchframework" in out["error"]


def test_a_missing_builtin_framework_names_the_extra(run_python):
    # Hide jax from the import system in a fresh process; the registry must say how to get it.
    result = run_python("""
        import sys, importlib.util
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "jax" else real(name, *a)
        import xdevice
        try:
            xdevice.backend("jax")
        except xdevice.BackendUnavailable as error:
            print(error)
    """)
    assert "Fix: pip install 'xdevice[jax]'" in result.stdout, result.stderr


def _models_of_every_framework():
    """(object, owner) for what users hold: a module, a Keras model, a tf.function, a JAX pair,
    a plain function."""
    found = []
    torch = pytest.importorskip("torch")
    found.append((torch.nn.Linear(3, 2), "torch"))
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    found.append((keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), "tensorflow"))
    found.append((tf.function(lambda x: x * 2), "tensorflow"))
    jnp = pytest.importorskip("jax.numpy")
    found.append(((lambda p, x: x @ p["w"], {"w": jnp.ones((3, 2))}), "jax"))
    found.append((lambda x: jnp.sin(x), "jax"))
    return found


def test_every_caller_gets_the_same_owner_for_every_kind_of_model():
    from xdevice import _registry
    from xdevice.converters.detect import framework_of
    from xdevice.training.programs import _owner

    for model, expected in _models_of_every_framework():
        backend, kind = _registry.owner(model)
        assert (backend.name, kind) == (expected, "model"), model
        assert framework_of(model) == expected and _owner(model).name == expected


def test_an_object_nobody_owns_gets_one_error_listing_what_each_backend_accepts():
    from xdevice.converters.detect import framework_of
    from xdevice.training.programs import _owner

    _models_of_every_framework()  # every framework loaded: each lists what it accepts
    with pytest.raises(xdevice.ConversionError) as exported:
        framework_of(object())
    with pytest.raises(xdevice.ConfigurationError) as trained:
        _owner(object())
    for error in (exported, trained):
        assert "torch: torch.nn.Module" in str(error.value) and "tensorflow: a Keras model" in str(error.value)
    with pytest.raises(xdevice.ConversionError, match="A PyTorch model is not an array"):
        xdevice.backend_of(_models_of_every_framework()[0][0])


def test_the_owner_of_a_type_is_remembered_and_containers_are_not():
    import numpy as np

    from xdevice import _registry

    _registry.owner(np.zeros(1))
    assert _registry._owners[np.ndarray] == (xdevice.backend("numpy"), "array")
    _registry.owner((lambda p, x: x, {"w": np.ones(2)}))
    assert tuple not in _registry._owners


def test_titles_and_providers_are_read_without_importing_a_framework(run_python):
    result = run_python("""
        import json, sys
        from xdevice import _registry
        out = {
            "titles": {name: _registry.title(name) for name in _registry.backends(all=True)},
            "agents": _registry.providers("agent", all=True),
            "imported": [m for m in ("torch", "jax", "tensorflow") if m in sys.modules],
        }
        print(json.dumps(out))
    """)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["titles"] == {"numpy": "NumPy", "torch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow"}
    assert out["agents"] == ["torch"] and out["imported"] == []


def test_a_backend_whose_package_has_no_title_is_called_by_its_name(tmp_path, run_python):
    dist = tmp_path / "xdevice_plugin_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: xdevice-plugin-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[xdevice.backends]\nnosuchframework = json:JSONDecoder\n")
    result = run_python(
        "from xdevice import _registry; print(_registry.title('nosuchframework'))", env={"PYTHONPATH": str(tmp_path)}
    )
    assert result.returncode == 0 and result.stdout.strip() == "nosuchframework", result.stderr
