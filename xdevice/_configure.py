"""``configure``: visible devices, memory growth, memory limits and virtual CPUs, once for all.

Each framework reads some settings only before its runtime starts (TensorFlow raises
afterwards; PyTorch and JAX silently ignore late environment variables). ``configure``
asks every backend whether its runtime started and raises ``ConfigurationError`` naming
the framework and the fix, instead of letting a setting quietly not apply.

Decisions:
- Visibility is set once, here, through ``CUDA_VISIBLE_DEVICES`` (and ``HIP_VISIBLE_DEVICES``),
  which every framework's CUDA runtime reads when it starts; afterwards every framework
  numbers the chosen GPUs from 0, as CUDA does.
- ``configure()`` applies to every installed backend and imports their frameworks to do so
  (importing starts no runtime). Settings a backend cannot honour are reported as
  ``unsupported`` in the returned report; naming that backend in ``backends=`` turns
  them into errors, since then the user asked that framework for it specifically.
- Calling ``configure`` again with the same settings after a runtime started is allowed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence

from xdevice import _registry
from xdevice._discovery import clear_cache, nvml_gpus, nvml_physical_gpus, visible_gpu_indices
from xdevice._errors import ConfigurationError, DeviceNotFound, message
from xdevice._types import Applied, Config, ConfigReport, shown

__all__ = ["configure", "current_config"]

logger = logging.getLogger("xdevice")
_applied: dict[str, tuple[Config, list[Applied]]] = {}  # backend -> (settings, their report)
_lock = threading.Lock()


def configure(
    visible: str | int | Sequence[object] | None = None,
    memory_growth: bool | None = None,
    memory_limit: int | str | Mapping[object, int | str] | None = None,
    cpu_devices: int | None = None,
    *,
    backends: list[str] | None = None,
) -> ConfigReport:
    """Set devices and memory for every installed backend, before their runtimes start.

    Args:
        visible: the GPUs to use (``["gpu:0", "gpu:2"]`` or ``[0, 2]``); others are hidden
            and the chosen ones are renumbered from 0 in every framework.
        memory_growth: True allocates GPU memory on demand; False pre-allocates a pool.
        memory_limit: bytes per GPU (an int, a string like ``"4GiB"``, or a dict from device
            to bytes). The report says per backend whether it is enforced, a pool, or advisory.
        cpu_devices: split the CPU into N devices (JAX, TensorFlow) so multi-device code
            runs without GPUs; PyTorch runs N worker processes instead.
        backends: apply to these backends only (default: every installed one).

    Returns:
        A ``ConfigReport``: one row per backend and setting saying how it took effect.

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
    targets = [_registry.backend(name) for name in names]
    with _lock:
        late = [b for b in targets if current_config(b.name) != config and b.runtime_started()]
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
        for target in targets:
            if current_config(target.name) == config:
                report += _applied[target.name][1]  # already in effect: report it again
                continue
            entries = target.configure_devices(config) + target.configure_memory(config, gpus)
            if backends is not None:
                _refuse_unsupported(entries)
            report += entries
            _applied[target.name] = (config, entries)
        clear_cache()  # what is visible, and how many CPU devices, may have changed
    logger.info("xdevice.configure:\n%s", report)
    return report


def current_config(backend: str) -> Config | None:
    """The settings last applied to ``backend`` through ``configure`` (None if never)."""
    return _applied[backend][0] if backend in _applied else None


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
