"""Every backend implements every abstract method of the Backend contract, identically."""

import inspect

import pytest

from xdevice.backends.base import Backend

ABSTRACT = sorted(Backend.__abstractmethods__)


def test_the_backend_class_has_no_unimplemented_method(backend):
    assert not type(backend).__abstractmethods__


@pytest.mark.parametrize("method", ABSTRACT)
def test_each_method_has_the_contract_signature(backend, method):
    expected = inspect.signature(getattr(Backend, method))
    actual = inspect.signature(getattr(type(backend), method))
    assert [(p.name, p.kind, p.default) for p in actual.parameters.values()] == \
           [(p.name, p.kind, p.default) for p in expected.parameters.values()]


def test_the_backend_name_is_its_framework_import_name(backend):
    import importlib.util

    assert importlib.util.find_spec(backend.name) is not None
    assert backend.title and backend.version()


@pytest.mark.parametrize("flag", ["supports_memory_limit", "supports_preallocation",
                                  "supports_virtual_devices", "has_default_device"])
def test_capability_flags_are_booleans(backend, flag):
    assert isinstance(getattr(backend, flag), bool)


def test_asking_for_a_missing_capability_raises_instead_of_doing_nothing():
    import xdevice

    numpy = xdevice.backend("numpy")
    with pytest.raises(xdevice.ConfigurationError, match="cannot do virtual CPU devices"):
        numpy.require("supports_virtual_devices", "virtual CPU devices")
