"""The import hook runs a function right after a module's first import, once, and otherwise
stays out of the way: made-up modules written to a temporary folder stand in for frameworks."""

import importlib
import importlib.util
import sys

import pytest

from xdevice import _import_hook


@pytest.fixture
def module_folder(tmp_path, monkeypatch):
    """A folder on sys.path; the modules written there are forgotten (and unwaited) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, code: str) -> str:
        (tmp_path / f"{name}.py").write_text(code)
        written.append(name)
        importlib.invalidate_caches()
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)
        _import_hook.forget(name)


def test_what_waits_runs_right_after_the_module_code_inside_the_import(module_folder):
    name = module_folder("xdevice_hook_a", "import sys\nready = True\nloader = __loader__\n")
    seen = []
    _import_hook.when_imported(name, lambda module: seen.append((module.ready, name in sys.modules)))

    module = importlib.import_module(name)

    assert seen == [(True, True)]
    assert module.loader is module.__spec__.loader is module.__loader__  # its own loader, not the hook's
    assert type(module.__loader__).__module__ != "xdevice._import_hook"


def test_it_runs_once_and_the_finder_leaves_when_nothing_waits(module_folder):
    name = module_folder("xdevice_hook_b", "")
    calls = []
    _import_hook.when_imported(name, calls.append)

    importlib.import_module(name)
    sys.modules.pop(name)
    importlib.import_module(name)  # imported again: nothing waits any more

    assert len(calls) == 1
    assert _import_hook.waiting() == []
    assert not any(type(finder).__module__ == "xdevice._import_hook" for finder in sys.meta_path)


def test_a_module_that_fails_to_import_keeps_the_wait_for_the_next_attempt(module_folder):
    name = module_folder("xdevice_hook_c", "raise ImportError('not today')\n")
    calls = []
    _import_hook.when_imported(name, calls.append)

    with pytest.raises(ImportError, match="not today"):
        importlib.import_module(name)

    assert calls == [] and _import_hook.waiting() == [name]


def test_only_the_module_waited_for_is_found_through_the_hook(module_folder):
    waited = module_folder("xdevice_hook_d", "")
    other = module_folder("xdevice_hook_e", "")
    _import_hook.when_imported(waited, lambda module: None)

    hooked = {
        name: type(importlib.util.find_spec(name).loader).__module__ == "xdevice._import_hook"
        for name in (waited, other)
    }
    importlib.import_module(other)

    assert hooked == {waited: True, other: False}
    assert _import_hook.waiting() == [waited]


def test_only_top_level_modules_can_be_waited_for():
    with pytest.raises(ValueError, match="top-level modules only"):
        _import_hook.when_imported("tensorflow.config", lambda module: None)


def test_importing_xdevice_installs_no_hook(run_python):
    result = run_python("""
        import sys, xdevice
        print(sum(type(f).__module__ == "xdevice._import_hook" for f in sys.meta_path))
    """)
    assert result.stdout.strip() == "0", result.stderr
