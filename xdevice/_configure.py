"""``configure``: devices, memory, matmul precision and determinism, once for all frameworks.

Each framework reads some settings only before its runtime starts (TensorFlow raises
afterwards; PyTorch and JAX silently ignore late environment variables). ``configure``
asks every backend whether its runtime started and raises ``ConfigurationError`` naming
the framework and the fix, instead of letting a setting quietly not apply.

Decisions:
- Visibility is set once, here, through ``CUDA_VISIBLE_DEVICES`` (the chosen GPUs' UUIDs: see ``_set_visible``),
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

import dataclasses
import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast, overload

from xdevice import _discovery, _import_hook, _registry, _seed
from xdevice._device import Device
from xdevice._discovery import clear_cache, nvml_gpus, nvml_physical_gpus, visible_gpu_indices
from xdevice._errors import ConfigurationError, DeviceNotFound, message
from xdevice._types import DEFAULT_PRECISION, NUMERICS, Applied, Config, ConfigReport, shown

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = [
    "configure",
    "current_config",
    "apply_pending",
    "AppliesPendingConfiguration",
    "matmul_precision",
    "deterministic",
    "memory_limit_for",
]

logger = logging.getLogger("xdevice")
_applied: dict[str, tuple[Config, list[Applied]]] = {}  # backend -> (settings, their report)
_pending: dict[str, tuple[Config, list[Device]]] = {}  # backend -> (settings, GPUs) awaiting its import
_process = Config()  # the process-wide settings: the last device settings given, the numerics set so far
_numerics: dict[str, tuple[tuple[str, bool], list[Applied]]] = {}  # backend -> (numerics in effect, their report)
_lock = threading.RLock()  # reentrant: creating a backend inside configure applies what waits for it
_REGISTRY_WAIT = 10.0  # seconds the import hook waits for another thread creating backends


def configure(
    visible: str | int | Sequence[object] | None = None,
    memory_growth: bool | None = None,
    memory_limit: int | str | Mapping[object, int | str] | None = None,
    cpu_devices: int | None = None,
    matmul_precision: str | None = None,
    deterministic: bool | None = None,
    *,
    backends: list[str] | None = None,
) -> ConfigReport:
    """Set devices, memory, precision and determinism for every installed backend, before
    their runtimes start.

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
        matmul_precision: float32 matrix products and convolutions in ``"highest"`` (IEEE
            float32, the default), ``"high"`` (TF32, or three bfloat16 passes) or ``"medium"``
            (bfloat16), PyTorch's names; it may change at any time. None keeps the one in effect.
        deterministic: True turns on each framework's deterministic kernels and pins the
            CPU's intra-op threads of PyTorch and TensorFlow to 1, so that a seeded run
            repeats bit for bit (and across machines with other core counts). It must come
            before the framework's runtime starts, and cannot be turned off afterwards.
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
    >>> configure(matmul_precision="tf32")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ConfigurationError: matmul_precision is the float32 matmul precision, in PyTorch's names...
    """
    request = Config.make(visible, memory_growth, memory_limit, cpu_devices, matmul_precision, deterministic)
    names = _registry.backends() if backends is None else list(backends)
    now = [name for name in names if backends is not None or name in sys.modules]
    with _lock:
        _refuse_undoing_determinism(request)
        numerics = _numerics_after(request)
        wanted = {name: _merged(current_config(name), request, numerics) for name in names}
        for name in now:  # what waited for them is superseded (and must not apply as they load)
            _drop_pending(name)
    loaded = {name: _registry.backend(name) for name in now}
    with _lock:
        _refuse_late(loaded, wanted, numerics)
        visible = None if request.visible is None else _visible_uuids(request)  # refused before anything applies
        global _process
        _process = _merged(_process, request, numerics)
        report = ConfigReport()
        if visible is not None:
            report += _set_visible(request, names, visible)
        gpus = nvml_gpus()
        for name in names:
            target = loaded.get(name)
            config = wanted[name]
            if target is None:
                report += _wait_for_import(name, config, gpus)
                continue
            before = current_config(name)
            if before == config:
                report += _applied[name][1]  # already in effect: report it again
                continue
            if before is not None and before.devices_part == config.devices_part:
                entries = [row for row in _applied[name][1] if row.setting not in NUMERICS]  # in effect
            else:
                entries = target.configure_devices(config) + target.configure_memory(config, gpus)
            entries += _given(config, _sync_numerics(target))
            if backends is not None:
                _refuse_unsupported(entries)
            report += entries
            _applied[name] = (config, entries)
        clear_cache()  # what is visible, and how many CPU devices, may have changed
    logger.info("xdevice.configure:\n%s", report)
    return report


@overload
def current_config(backend: None = None) -> Config: ...
@overload
def current_config(backend: str) -> Config | None: ...
def current_config(backend: str | None = None) -> Config | None:
    """The settings in effect.

    Args:
        backend: a backend's name: the settings last given to it through ``configure``,
            applied or pending (None if never). Without it: the process-wide settings, the
            numerics filled in with their defaults (``matmul_precision="highest"``,
            ``deterministic=False``).

    >>> current_config().matmul_precision
    'highest'
    """
    if backend is not None:
        return _applied[backend][0] if backend in _applied else None
    return dataclasses.replace(_process, matmul_precision=matmul_precision(), deterministic=deterministic())


class AppliesPendingConfiguration:
    """Base of every backend's ``Devices``: creating the backend applies the settings that
    ``configure`` recorded while its framework was not imported (when xdevice itself imports
    the framework, the import hook leaves them to this), the precision and determinism in
    effect (the project's default precision when ``configure`` never set one), and the seed
    ``xdevice.seed`` set."""

    def __init__(self) -> None:
        super().__init__()
        apply_pending(cast("Backend", self))


def apply_pending(target: Backend) -> None:
    """Apply the settings waiting for ``target``'s framework, if any, and report them in place
    of the pending rows; bring its numerics and seed up to date. What the backend raises
    propagates, and the settings stay pending."""
    name = target.name
    with _lock:
        waiting = _pending.get(name)
        entries: list[Applied] = []
        if waiting is not None:
            config, gpus = waiting
            entries = target.configure_devices(config) + target.configure_memory(config, gpus)
        numerics = _sync_numerics(target)
        if waiting is not None:
            entries += _given(waiting[0], numerics)
            del _pending[name]
            _applied[name] = (waiting[0], entries)
            clear_cache()
        _seed.seed_backend(target)
        _watch(name)
    if entries:
        logger.info("xdevice.configure, applied as %s loaded:\n%s", target.title, ConfigReport(entries))


def matmul_precision() -> str:
    """The process-wide float32 matmul precision: ``"highest"`` unless ``configure`` set another.

    >>> matmul_precision()
    'highest'
    """
    return _process.matmul_precision or DEFAULT_PRECISION


def deterministic() -> bool:
    """Whether ``configure(deterministic=True)`` is in effect for the process.

    >>> deterministic()
    False
    """
    return bool(_process.deterministic)


def memory_limit_for(device: Device) -> int | None:
    """The memory limit in bytes ``configure`` set for ``device`` (None: no limit).

    >>> memory_limit_for(Device("gpu", 0)) is None  # configure(memory_limit=...) never called
    True
    """
    return _process.limit_for(device)


def _numerics_after(request: Config) -> Config:
    """The process-wide numerics once ``request`` is applied (None: never set)."""
    return Config(
        matmul_precision=request.matmul_precision or _process.matmul_precision,
        deterministic=_process.deterministic if request.deterministic is None else request.deterministic,
    )


def _merged(before: Config | None, request: Config, numerics: Config) -> Config:
    """``request``'s device settings (or, when it gives none, those of ``before``) with the
    process-wide ``numerics``."""
    devices = request.devices_part if before is None or not request.devices_part.is_empty else before.devices_part
    precision, determinism = numerics.matmul_precision, numerics.deterministic
    return dataclasses.replace(devices, matmul_precision=precision, deterministic=determinism)


def _given(config: Config, rows: list[Applied]) -> list[Applied]:
    """The rows of the numerics ``config`` sets (the defaults go unreported)."""
    return [row for row in rows if getattr(config, row.setting, None) is not None]


def _sync_numerics(target: Backend) -> list[Applied]:
    """Apply the process-wide precision and determinism to ``target`` unless in effect; their rows."""
    wanted = (matmul_precision(), deterministic())
    done = _numerics.get(target.name)
    if done is not None and done[0] == wanted:
        return done[1]
    if wanted[1] and not (done is not None and done[0][1]) and target.runtime_started():
        raise ConfigurationError(_too_late_for_determinism([target]))
    rows = target.configure_numerics(current_config())
    _numerics[target.name] = (wanted, rows)
    return rows


def _refuse_late(loaded: Mapping[str, Backend], wanted: Mapping[str, Config], numerics: Config) -> None:
    """Raise, before anything is applied, for a started runtime whose start-up settings change."""
    late = [
        b
        for b in loaded.values()
        if (current_config(b.name) or Config()).devices_part != wanted[b.name].devices_part and b.runtime_started()
    ]
    if late:
        titles = ", ".join(b.title for b in late)
        raise ConfigurationError(
            message(
                f"{titles} already started, so these settings can no longer take effect",
                expected="configure() before the first computation on any device",
                received=f"configure({_describe(wanted[late[0].name].devices_part)}) after {titles} started",
                fix="call xdevice.configure(...) at the top of your program, right after "
                "the imports, or leave the started framework out with backends=[...]",
            )
        )
    if numerics.deterministic:
        late = [
            b for b in loaded.values() if not (b.name in _numerics and _numerics[b.name][0][1]) and b.runtime_started()
        ]
        if late:
            raise ConfigurationError(_too_late_for_determinism(late))


def _too_late_for_determinism(late: Sequence[Backend]) -> str:
    titles = ", ".join(b.title for b in late)
    return message(
        f"{titles} already started, so deterministic=True can no longer take effect: each framework "
        "reads part of it only as its runtime starts (PyTorch: CUBLAS_WORKSPACE_CONFIG, when CUDA "
        "starts; TensorFlow: its intra-op thread count; JAX: --xla_gpu_deterministic_ops in XLA_FLAGS)",
        expected="configure(deterministic=True) before the first computation",
        received=f"configure(deterministic=True) after {titles} started",
        fix="call xdevice.configure(deterministic=True) at the top of your program, right after the "
        "imports (or leave the started framework out with backends=[...])",
    )


def _refuse_undoing_determinism(request: Config) -> None:
    if request.deterministic is False and _process.deterministic:
        raise ConfigurationError(
            message(
                "deterministic=True cannot be turned off in a running process: the frameworks read "
                "part of it only as their runtimes start",
                received="configure(deterministic=False) after configure(deterministic=True)",
                fix="run the non-deterministic part in another process, or leave deterministic out (None "
                "keeps what is in effect)",
            )
        )


def _wait_for_import(name: str, config: Config, gpus: list[Device]) -> list[Applied]:
    """Record ``config`` for a framework not imported yet; its pending rows."""
    if current_config(name) != config:
        settings = {k: v for k, v in vars(config).items() if v is not None and k != "visible"}  # visible: done
        rows = [Applied(name, k, v, "pending", f"applied when {name} is imported") for k, v in settings.items()]
        _applied[name] = (config, rows)
        if rows:
            _pending[name] = (config, gpus)
        else:  # nothing of this framework's own to apply
            _pending.pop(name, None)
        _watch(name)
    return _applied[name][1]


def _drop_pending(name: str) -> None:
    if _pending.pop(name, None) is not None:
        _applied.pop(name, None)  # recorded, never applied
    _watch(name)


def _watch(name: str) -> None:
    """Wait for ``name``'s import while settings or a seed wait for it (one callback serves both)."""
    if name in _pending or _seed.waits_for(name):
        _import_hook.when_imported(name, _framework_loaded)
    else:
        _import_hook.forget(name)


def _framework_loaded(module: ModuleType) -> None:
    """The import hook's callback: the program imported a framework whose settings wait."""
    name = module.__name__
    if (name not in _pending and not _seed.waits_for(name)) or _xdevice_is_loading(name):
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


def _visible_uuids(config: Config) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` that ``config.visible`` asks for: the chosen GPUs' UUIDs, in
    order, ``gpu:N`` counted among the GPUs visible now (as ``xdevice.devices()`` lists them).

    Raises:
        DeviceNotFound: a GPU that is not visible.
        ConfigurationError: the CUDA driver already started in this process and this would
            change what it sees (it read the variable once, as it started; asking the same GPUs
            again is fine).
    """
    physical = nvml_physical_gpus()
    uuids = [uuid for uuid, _ in physical]
    order = visible_gpu_indices(uuids)  # what is visible now
    visible = config.visible or ()
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
    chosen = [uuids[order[d.index]] for d in visible]
    if chosen != [uuids[i] for i in order] and _discovery.cuda_driver_started():
        shown_visible = [str(d) for d in visible]
        raise ConfigurationError(
            message(
                "The CUDA driver already started in this process, so visible= can no longer take effect: CUDA "
                "read CUDA_VISIBLE_DEVICES once, as it started (torch.cuda.is_available() starts it, as does any "
                "first use of a GPU in PyTorch, JAX or TensorFlow)",
                expected="configure(visible=...) before anything in the program touches CUDA",
                received=f"configure(visible={shown_visible}) after the CUDA driver started",
                fix="call xdevice.configure(visible=...) at the top of your program, right after the imports and "
                f"before any torch.cuda call, or start the program with CUDA_VISIBLE_DEVICES={','.join(chosen)}",
            )
        )
    return ",".join(chosen)


def _set_visible(config: Config, names: list[str], uuids: str) -> list[Applied]:
    """Make the GPUs of ``uuids`` (from :func:`_visible_uuids`) the visible ones.

    ``CUDA_VISIBLE_DEVICES`` gets UUIDs, not numbers: a number means a card only under one
    ``CUDA_DEVICE_ORDER``, and a MIG slice has no number at all. ``HIP_VISIBLE_DEVICES`` is
    left alone: NVML lists only NVIDIA GPUs, whose names mean nothing to ROCm.
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = uuids
    return [
        Applied(name, "visible", config.visible, "applied", f"CUDA_VISIBLE_DEVICES={uuids}, read when CUDA starts")
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
