"""Every backend implements every abstract method of the Backend contract, and overrides its
optional hooks, identically; the parts of a backend package outside the class keep theirs."""

import importlib
import importlib.util
import inspect

import pytest

from xdevice import _registry
from xdevice.backends.base import OWNED_KINDS, Backend

ABSTRACT = sorted(Backend.__abstractmethods__)
HOOKS = sorted(
    name
    for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_") and name not in Backend.__abstractmethods__ and name != "require"
)
#: the functions of a backend's training.py the trainer calls, with their parameters
TRAINING = {"program": ["backend", "model", "device"], "split": ["backend", "model", "devices"]}
#: the functions of a backend's launch.py the launcher's workers call, with their parameters
LAUNCH = {"environment": ["rendezvous"]}


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_backend_class_has_no_unimplemented_method(backend):
    assert not type(backend).__abstractmethods__


@pytest.mark.parametrize("method", ABSTRACT)
def test_each_method_has_the_contract_signature(backend, method):
    assert _parameters(getattr(type(backend), method)) == _parameters(getattr(Backend, method))


@pytest.mark.parametrize("hook", HOOKS)
def test_each_optional_hook_a_backend_overrides_keeps_the_contract_signature(backend, hook):
    mine = getattr(type(backend), hook)
    if mine is getattr(Backend, hook):
        pytest.skip(f"{backend.name} keeps the default {hook}")
    assert _parameters(mine) == _parameters(getattr(Backend, hook))


def test_the_backend_says_what_it_owns(backend):
    x = backend.ops.asarray([1.0, 2.0])
    assert backend.owns(x) == "array" and backend.owns(object()) is None
    assert set(backend.accepts) <= set(OWNED_KINDS)
    native = backend.native_device(backend.list_devices()[0])
    if backend.owns(native) == "device":  # numpy names its one CPU with a plain string
        assert backend.device_from_native(native) == backend.list_devices()[0]


def test_the_numerics_are_read_back_with_a_precision_and_a_determinism_flag(backend):
    found = backend.numerics()
    assert found["matmul_precision"] is not None and isinstance(found["deterministic"], bool)
    assert importlib.util.find_spec(f"xdevice.backends.{backend.name}.numerics") is not None  # the same file everywhere


def test_the_training_adapters_keep_their_signatures(backend):
    adapters = _registry.extension(backend.name, "training")
    if adapters is None:
        pytest.skip(f"{backend.name} trains zoo models only")
    assert hasattr(adapters, "program")
    for name, parameters in TRAINING.items():
        if hasattr(adapters, name):
            assert [p[0] for p in _parameters(getattr(adapters, name))] == parameters


def test_the_launch_hook_keeps_its_signature(backend):
    hook = _registry.extension(backend.name, "launch")
    if hook is None:
        assert not backend.supports_processes  # a backend that joins processes reads what its hook wrote
        pytest.skip(f"{backend.name} needs nothing to run in several processes")
    for name, parameters in LAUNCH.items():
        assert [p[0] for p in _parameters(getattr(hook, name))] == parameters


def test_the_title_lives_once_in_the_package(backend):
    package = importlib.import_module(f"xdevice.backends.{backend.name}")
    assert backend.title == package.TITLE == _registry.title(backend.name)


def test_the_package_answers_gpu_build_without_arguments(backend):
    package = importlib.import_module(f"xdevice.backends.{backend.name}")
    hook = getattr(package, "gpu_build", None)
    if hook is None:
        assert not backend.supports_gpu  # only a backend that never runs on a GPU may leave it out
    else:
        assert _parameters(hook) == [] and isinstance(hook(), bool)


def test_the_backend_name_is_its_framework_import_name(backend):
    import importlib.util

    assert importlib.util.find_spec(backend.name) is not None
    assert backend.title and backend.version()


@pytest.mark.parametrize(
    "flag", ["supports_memory_limit", "supports_preallocation", "supports_virtual_devices", "has_default_device"]
)
def test_capability_flags_are_booleans(backend, flag):
    assert isinstance(getattr(backend, flag), bool)


def test_asking_for_a_missing_capability_raises_instead_of_doing_nothing():
    import xdevice

    numpy = xdevice.backend("numpy")
    with pytest.raises(xdevice.ConfigurationError, match="cannot do virtual CPU devices"):
        numpy.require("supports_virtual_devices", "virtual CPU devices")
