"""``configure``: visible devices, memory growth, memory limits and virtual CPUs, once for all.

Each framework reads some settings only before its runtime starts (TensorFlow raises
afterwards; PyTorch and JAX silently ignore late environment variables). ``configure``
asks every backend whether its runtime started and raises ``ConfigurationError`` naming
the framework and the fix, instead of letting a setting quietly not apply.

Decisions:
- Visibility is set once, here, through ``CUDA_VISIBLE_DEVICES`` (and ``HIP_VISIBLE_DEVICES``),
  which every framework's CUDA runtime reads when it starts; afterwards every framework
  numbers the chosen GPUs from 0, as CUDA does.
- ``configure()`` costs only what the program uses: a framework already imported is configured
  at once; one not imported yet is not imported for it. Its settings wait, reported as
  ``pending``, and are applied right after it first loads, before anything can start its
  runtime (importing a framework starts none): by an import hook when the program imports it
  (``xdevice._import_hook``: ``import tensorflow`` then sees the virtual CPUs), or by the
  backend's own start-up when xdevice is the one importing it (``AppliesPendingConfiguration``,
  the base of every backend's ``Devices``).
- A backend named in ``backends=`` is configured at once, importing its framework: settings it
  cannot honour are then errors (the user asked that framework for them specifically), and
  only applying them can tell. Without ``backends=`` they are reported as ``unsupported``.
- Calling ``configure`` again with the same settings after a runtime started is allowed; new
  settings replace those still pending.
- If applying pending settings fails as the framework loads (not expected, since its runtime
  cannot have started yet; or another thread held the backend registry for 10 s, creating that
  very backend and waiting for the import the hook runs in), the program's ``import`` still
  succeeds, with a ``RuntimeWarning``; the settings stay pending, and xdevice's first use of
  that framework applies them or raises.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

from xdevice import _import_hook, _registry
from xdevice._device import Device
from xdevice._discovery import clear_cache, nvml_gpus, nvml_physical_gpus, visible_gpu_indices
from xdevice._errors import ConfigurationError, DeviceNotFound, message
from xdevice._types import Applied, Config, ConfigReport, shown

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = ["configure", "current_config", "apply_pending", "AppliesPendingConfiguration"]

logger = logging.getLogger("xdevice")
_applied: dict[str, tuple[Config, list[Applied]]] = {}  # backend -> (settings, their report)
_pending: dict[str, tuple[Config, list[Device]]] = {}  # backend -> (settings, GPUs) awaiting its import
_lock = threading.RLock()  # reentrant: creating a backend inside configure applies what waits for it
_REGISTRY_WAIT = 10.0  # seconds the import hook waits for another thread creating backends


def configure(
    visible: str | int | Sequence[object] | None = None,
    memory_growth: bool | None = None,
    memory_limit: int | str | Mapping[object, int | str] | None = None,
    cpu_devices: int | None = None,
    *,
    backends: list[str] | None = None,
) -> ConfigReport:
    """Set devices and memory for every installed backend, before their runtimes start.

    A framework already imported is configured at once; the settings of one not imported yet
    are applied when it first loads (``import tensorflow`` in the program, or xdevice's first
    use of it), so a program pays only for the frameworks it uses. The report says ``pending``
    for those.

    Args:
        visible: the GPUs to use (``["gpu:0", "gpu:2"]`` or ``[0, 2]``); others are hidden
            and the chosen ones are renumbered from 0 in every framework.
        memory_growth: True allocates GPU memory on demand; False pre-allocates a pool.
        memory_limit: bytes per GPU (an int, a string like ``"4GiB"``, or a dict from device
            to bytes). The report says per backend whether it is enforced, a pool, or advisory.
        cpu_devices: split the CPU into N devices (JAX, TensorFlow) so multi-device code
            runs without GPUs; PyTorch runs N worker processes instead.
        backends: apply to these backends only, at once, importing their frameworks
            (default: every installed one, each when its framework loads).

    Returns:
        A ``ConfigReport``: one row per backend and setting saying how it took effect, or
        that it is pending (``detail``: "applied when tensorflow is imported").

    Raises:
        ConfigurationError: a bad value, a runtime that already started, or (for a backend
            named in ``backends``) a setting it cannot honour.
        DeviceNotFound: ``visible`` names a GPU that does not exist.

    >>> report = configure(cpu_devices=4)  # at the top of a program, before any computation  # doctest: +SKIP
    >>> configure(cpu_devices=2, backends=["numpy"])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigurationError: Backend 'numpy' cannot apply cpu_devices=2 (it has a single CPU device)
    """
    config = Config.make(visible, memory_growth, memory_limit, cpu_devices)
    names = _registry.backends() if backends is None else list(backends)
    now = [name for name in names if backends is not None or name in sys.modules]
    with _lock:
        for name in now:  # what waited for them is superseded (and must not apply as they load)
            _drop_pending(name)
    loaded = {name: _registry.backend(name) for name in now}
    with _lock:
        late = [b for b in loaded.values() if current_config(b.name) != config and b.runtime_started()]
        if late:
            titles = ", ".join(b.title for b in late)
            raise ConfigurationError(
                message(
                    f"{titles} already started, so these settings can no longer take effect",
                    expected="configure() before the first computation on any device",
                    received=f"configure({_describe(config)}) after {titles} started",
                    fix="call xdevice.configure(...) at the top of your program, right after "
                    "the imports, or leave the started framework out with backends=[...]",
                )
            )
        report = ConfigReport()
        if config.visible is not None:
            report += _set_visible(config, names)
        gpus = nvml_gpus()
        for name in names:
            target = loaded.get(name)
            if target is None:
                report += _wait_for_import(name, config, gpus)
                continue
            if current_config(name) == config:
                report += _applied[name][1]  # already in effect: report it again
                continue
            entries = target.configure_devices(config) + target.configure_memory(config, gpus)
            if backends is not None:
                _refuse_unsupported(entries)
            report += entries
            _applied[name] = (config, entries)
        clear_cache()  # what is visible, and how many CPU devices, may have changed
    logger.info("xdevice.configure:\n%s", report)
    return report


def current_config(backend: str) -> Config | None:
    """The settings last given to ``backend`` through ``configure``, applied or pending (None if
    never)."""
    return _applied[backend][0] if backend in _applied else None


class AppliesPendingConfiguration:
    """Base of every backend's ``Devices``: creating the backend applies the settings that
    ``configure`` recorded while its framework was not imported (when xdevice itself imports
    the framework, the import hook leaves them to this)."""

    def __init__(self) -> None:
        super().__init__()
        apply_pending(cast("Backend", self))


def apply_pending(target: Backend) -> None:
    """Apply the settings waiting for ``target``'s framework, if any, and report them in place
    of the pending rows. What the backend raises propagates, and the settings stay pending."""
    with _lock:
        if target.name not in _pending:
            return
        config, gpus = _pending[target.name]
        entries = target.configure_devices(config) + target.configure_memory(config, gpus)
        del _pending[target.name]
        _applied[target.name] = (config, entries)
        _import_hook.forget(target.name)
        clear_cache()
    logger.info("xdevice.configure, applied as %s loaded:\n%s", target.title, ConfigReport(entries))


def _wait_for_import(name: str, config: Config, gpus: list[Device]) -> list[Applied]:
    """Record ``config`` for a framework not imported yet; its pending rows."""
    if current_config(name) != config:
        settings = {k: v for k, v in vars(config).items() if v is not None and k != "visible"}  # visible: done
        rows = [Applied(name, k, v, "pending", f"applied when {name} is imported") for k, v in settings.items()]
        _applied[name] = (config, rows)
        if rows:
            _pending[name] = (config, gpus)
            _import_hook.when_imported(name, _framework_loaded)
        else:  # nothing of this framework's own to apply
            _pending.pop(name, None)
            _import_hook.forget(name)
    return _applied[name][1]


def _drop_pending(name: str) -> None:
    if _pending.pop(name, None) is not None:
        _applied.pop(name, None)  # recorded, never applied
    _import_hook.forget(name)


def _framework_loaded(module: ModuleType) -> None:
    """The import hook's callback: the program imported a framework whose settings wait."""
    name = module.__name__
    if name not in _pending or _xdevice_is_loading(name):
        return  # xdevice is creating this backend: its start-up applies them
    # This thread holds the framework's import lock. Another thread creating backends holds the
    # registry's lock, and if it is creating this one it waits for this import: never wait for
    # it without end. Given up, the settings wait for that thread's creation of the backend.
    if not _registry._lock.acquire(timeout=_REGISTRY_WAIT):
        _warn_not_applied(name, f"another thread held xdevice's backend registry for {_REGISTRY_WAIT:.0f} s")
        return
    try:
        apply_pending(_registry.backend(name))  # creating it applies them, for a backend that can
    except Exception as error:  # noqa: BLE001  the program's `import` must not fail for xdevice's sake
        _warn_not_applied(name, f"{type(error).__name__}: {error}")
    finally:
        _registry._lock.release()


def _warn_not_applied(name: str, why: str) -> None:
    warnings.warn(
        message(
            f"xdevice could not apply the settings configure() recorded for {_registry.title(name)} "
            f"as it loaded; they stay pending, and xdevice's first use of {name} raises if it started",
            received=why,
            fix=f"call xdevice.configure(...) again after `import {name}` to apply them at once",
        ),
        RuntimeWarning,
        stacklevel=3,
    )


def _xdevice_is_loading(name: str) -> bool:
    """Whether backend ``name``'s own modules are still running: xdevice imported the
    framework while creating the backend, which is not ready to be asked for yet."""
    package = _registry._entry_points()[name].module
    return any(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
        for key, module in list(sys.modules.items())
        if key == package or key.startswith(package + ".")
    )


def _set_visible(config: Config, names: list[str]) -> list[Applied]:
    visible = config.visible or ()
    physical = nvml_physical_gpus()
    order = visible_gpu_indices([uuid for uuid, _ in physical])  # what is visible now
    missing = [str(d) for d in visible if d.index >= len(order)]
    if missing:
        raise DeviceNotFound(
            message(
                "visible names GPUs that do not exist",
                expected="GPUs listed by xdevice.devices('gpu')",
                received=missing,
                choices=[f"gpu:{i}" for i in range(len(order))],
                fix="drop them, or check `xdevice devices`",
            )
        )
    indices = ",".join(str(order[d.index]) for d in visible)
    os.environ["CUDA_VISIBLE_DEVICES"] = indices
    os.environ["HIP_VISIBLE_DEVICES"] = indices
    return [
        Applied(name, "visible", config.visible, "applied", f"CUDA_VISIBLE_DEVICES={indices}, read when CUDA starts")
        for name in names
    ]


def _refuse_unsupported(entries: list[Applied]) -> None:
    refused = [e for e in entries if e.how == "unsupported"]
    if refused:
        first = refused[0]
        raise ConfigurationError(
            message(
                f"Backend {first.backend!r} cannot apply {first.setting}={shown(first.value, first.setting)}",
                expected="settings this backend supports",
                received=first.detail,
                fix=f"leave {first.backend!r} out of backends=[...] or drop {first.setting}",
            )
        )


def _describe(config: Config) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in vars(config).items() if v is not None)
