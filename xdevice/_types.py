"""Plain value types shared by core and backends: configuration, its report, memory stats.

Does not import any framework. Byte sizes are ints; ``parse_bytes`` reads ``"4GiB"`` too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Literal

from xdevice._device import Device, device
from xdevice._errors import ConfigurationError, message, nearest

__all__ = [
    "Config",
    "Applied",
    "ConfigReport",
    "MemoryStats",
    "parse_bytes",
    "format_bytes",
    "PRECISIONS",
    "DEFAULT_PRECISION",
    "NUMERICS",
]

#: Float32 matmul precisions, PyTorch's names (``torch.set_float32_matmul_precision``), best
#: first: ``highest`` computes in IEEE float32, ``high`` lets a GPU use TF32 (or three bfloat16
#: passes), ``medium`` one bfloat16 pass.
PRECISIONS = ("highest", "high", "medium")
#: The project's default, applied to each backend as xdevice starts it: every framework then
#: computes float32 products as the numpy reference does (JAX, TensorFlow and PyTorch's
#: convolutions would otherwise use TF32 on NVIDIA GPUs since Ampere).
DEFAULT_PRECISION = "highest"
#: What the frameworks call the same precisions (a hint in the error for a name not ours).
_PRECISION_ALIASES = {
    "float32": "highest",
    "fp32": "highest",
    "ieee": "highest",
    "tf32": "high",
    "tensorfloat32": "high",
    "bfloat16_3x": "high",
    "bfloat16": "medium",
    "bf16": "medium",
}
#: The settings that shape numbers rather than devices: they can change while a runtime runs
#: (but for ``deterministic=True``, which each framework must see before its runtime starts).
NUMERICS = ("matmul_precision", "deterministic")

#: How a setting took effect. ``enforced``: the framework fails an allocation past the
#: limit. ``pool``: the framework reserves that much up front and allocates inside it.
#: ``advisory``: recorded and used by xdevice, not enforced by the framework.
#: ``applied``: a non-limit setting took effect. ``skipped``: nothing to apply it to (no GPU,
#: say). ``unsupported``: the framework cannot do it. ``pending``: the framework is not imported
#: yet; the setting is applied when it is. ``detail`` says how, or why not.
How = Literal["enforced", "pool", "advisory", "applied", "skipped", "unsupported", "pending"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(?P<number>[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*(?P<unit>[a-z]*)\s*$")


_SPELLING = {
    "b": "B",
    "kb": "kB",
    "mb": "MB",
    "gb": "GB",
    "tb": "TB",
    "kib": "KiB",
    "mib": "MiB",
    "gib": "GiB",
    "tib": "TiB",
}


def parse_bytes(value: int | str, what: str = "memory_limit") -> int:
    """A positive byte count from an int or a string such as ``"4GiB"`` or ``"512 MB"``.

    >>> parse_bytes("1.5GiB")
    1610612736
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigurationError(
            message(
                f"{what} must be a number of bytes",
                expected="a positive int or a string like '4GiB'",
                received=f"{value!r} ({type(value).__name__})",
                fix=f"write e.g. {what}=4 * 2**30 or {what}='4GiB'",
            )
        )
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.match(value.lower())
        if match is None:
            raise ConfigurationError(
                message(
                    f"{what} is not a size",
                    expected="a number with an optional unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)",
                    received=value,
                    fix=f"write e.g. {what}='4GiB'",
                )
            )
        if match["unit"] not in _UNITS:
            close = nearest(match["unit"], [u for u in _UNITS if u])
            raise ConfigurationError(
                message(
                    f"{what} has an unknown unit {match['unit']!r}",
                    expected="B, kB, MB, GB, TB, KiB, MiB, GiB or TiB (any case)",
                    received=value,
                    fix=f"write e.g. {what}='{match['number']}{_SPELLING.get(close or '', 'GiB')}'",
                )
            )
        amount = float(match["number"]) * _UNITS[match["unit"]]
        number = int(max(min(amount, 2**63), -1))  # inf or past any machine: refused below
    if number <= 0:
        raise ConfigurationError(
            message(
                f"{what} must be positive",
                expected="more than 0 bytes",
                received=value,
                fix=f"leave {what} unset for no limit",
            )
        )
    if number >= 2**63:  # past any machine, and past the frameworks' int64 sizes
        raise ConfigurationError(
            message(f"{what} is larger than any machine's memory", received=value, fix=f"write e.g. {what}='4GiB'")
        )
    return number


def format_bytes(number: int | None) -> str:
    """``12.0 GiB`` style, or ``-`` for None.

    >>> format_bytes(3 * 2**30)
    '3.0 GiB'
    """
    if number is None:
        return "-"
    size = float(number)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"


@dataclasses.dataclass(frozen=True)
class Config:
    """Validated device and numerics settings, as ``xdevice.configure`` received them.

    ``None`` means "leave the framework's default" (for ``matmul_precision``: the project's,
    ``DEFAULT_PRECISION``). Build one through ``Config.make``, which validates and normalises
    what a user typed.
    """

    visible: tuple[Device, ...] | None = None
    memory_growth: bool | None = None
    memory_limit: int | Mapping[Device, int] | None = None
    cpu_devices: int | None = None
    matmul_precision: str | None = None
    deterministic: bool | None = None

    @classmethod
    def make(
        cls,
        visible: Any = None,
        memory_growth: Any = None,
        memory_limit: Any = None,
        cpu_devices: Any = None,
        matmul_precision: Any = None,
        deterministic: Any = None,
    ) -> Config:
        """Validate user input, of any type, into a Config (raises ConfigurationError/DeviceNotFound).

        >>> Config.make(matmul_precision="medium").matmul_precision
        'medium'
        """
        if visible is not None:
            if isinstance(visible, (str, int)):
                visible = [visible]
            visible = tuple(
                Device("gpu", v) if isinstance(v, int) and not isinstance(v, bool) else device(v) for v in visible
            )
            wrong = [str(d) for d in visible if d.kind != "gpu"]
            if wrong:
                raise ConfigurationError(
                    message(
                        "visible lists the accelerators to use; CPUs are always visible",
                        expected="GPU names such as 'gpu:0' or GPU indices",
                        received=wrong,
                        fix="drop the CPU entries (use cpu_devices=N for virtual CPUs)",
                    )
                )
        _check_flag("memory_growth", memory_growth, "True allocates on demand; False pre-allocates a pool")
        if isinstance(memory_limit, Mapping):
            memory_limit = {device(k): parse_bytes(v) for k, v in memory_limit.items()}
        elif memory_limit is not None:
            memory_limit = parse_bytes(memory_limit)
        if cpu_devices is not None and (
            isinstance(cpu_devices, bool) or not isinstance(cpu_devices, int) or cpu_devices < 1
        ):
            raise ConfigurationError(
                message(
                    "cpu_devices is the number of virtual CPU devices",
                    expected="an int of 1 or more",
                    received=cpu_devices,
                    fix="write e.g. cpu_devices=4",
                )
            )
        if matmul_precision is not None and matmul_precision not in PRECISIONS:
            meant = _PRECISION_ALIASES.get(str(matmul_precision).lower()) or nearest(str(matmul_precision), PRECISIONS)
            raise ConfigurationError(
                message(
                    "matmul_precision is the float32 matmul precision, in PyTorch's names",
                    expected="'highest' (IEEE float32), 'high' (TF32 or bfloat16x3) or 'medium' (bfloat16)",
                    received=matmul_precision,
                    choices=list(PRECISIONS),
                    suggestion=meant,
                    fix=f"write matmul_precision={meant or DEFAULT_PRECISION!r}",
                )
            )
        _check_flag(
            "deterministic",
            deterministic,
            "True turns on every framework's deterministic kernels (set before their runtimes start)",
        )
        return cls(visible, memory_growth, memory_limit, cpu_devices, matmul_precision, deterministic)

    def limit_for(self, dev: Device) -> int | None:
        """The memory limit in bytes that applies to ``dev``, or None."""
        if isinstance(self.memory_limit, Mapping):
            return self.memory_limit.get(dev)
        return self.memory_limit

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in dataclasses.fields(self))

    @property
    def devices_part(self) -> Config:
        """The device and memory settings alone (the numerics left unset)."""
        return dataclasses.replace(self, matmul_precision=None, deterministic=None)


@dataclasses.dataclass(frozen=True)
class Applied:
    """One setting on one backend, and how it took effect."""

    backend: str
    setting: str
    value: object
    how: How
    detail: str


class ConfigReport(list[Applied]):
    """What ``configure`` did: a list of :class:`Applied`, printable as a table."""

    def __str__(self) -> str:
        rows = [("backend", "setting", "value", "how", "detail")]
        rows += [(a.backend, a.setting, shown(a.value, a.setting), a.how, a.detail) for a in self]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows)

    def how(self, backend: str, setting: str) -> How | None:
        """How ``setting`` took effect on ``backend`` (None when not requested)."""
        for entry in self:
            if entry.backend == backend and entry.setting == setting:
                return entry.how
        return None


def shown(value: object, setting: str = "") -> str:
    """A setting's value as the report prints it (memory limits in binary units)."""
    if setting == "memory_limit" and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return ",".join(f"{k}={format_bytes(v)}" for k, v in value.items())
    return str(value)


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Memory on one device as one framework sees it; None where it cannot tell.

    Attributes:
        in_use: bytes currently held by the framework's arrays.
        peak: the most ``in_use`` has been since the process started.
        limit: the most the framework will use on this device.
        limit_how: ``enforced``, ``pool`` or ``advisory`` (see ``Applied``), or None.
    """

    device: Device
    backend: str
    in_use: int | None
    peak: int | None
    limit: int | None
    limit_how: How | None = None


def _check_flag(name: str, value: object, fix: str) -> None:
    """A setting that is True, False or None (not set)."""
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(
            message(
                f"{name} must be True or False",
                expected="a bool",
                received=value,
                choices=["True", "False"],
                fix=fix,
            )
        )
