"""The device model: canonical ``kind:index`` names and parsing of every native spelling.

Does not import PyTorch, JAX or TensorFlow: a native device object is read by the backend
that owns it (``Backend.device_from_native``), and only frameworks already imported are asked.

Canonical names are lower-case ``kind:index`` with kinds ``cpu``, ``gpu`` and ``tpu``;
``gpu`` alone means ``gpu:0``. Accepted spellings include ``cuda:1``, ``GPU:1``, ``/GPU:1``,
``/device:GPU:1``, ``/physical_device:GPU:1``,
``/job:localhost/replica:0/task:0/device:GPU:1``, a ``torch.device``, a JAX ``Device`` and a
TensorFlow ``LogicalDevice`` or ``PhysicalDevice``. Apple's ``mps`` and AMD's ``rocm``/``hip``
are GPUs too.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from xdevice._errors import DeviceNotFound, message

__all__ = ["Device", "device", "device_from_parts", "KINDS"]

KINDS = ("cpu", "gpu", "tpu")
_ALIASES = {
    "cpu": "cpu",
    "gpu": "gpu",
    "cuda": "gpu",
    "rocm": "gpu",
    "hip": "gpu",
    "mps": "gpu",
    "metal": "gpu",
    "tpu": "tpu",
}
# Optional TF job/replica/task prefix, optional "device:" or "physical_device:", then KIND:N.
_NAME = re.compile(
    r"^(?:/job:[\w-]+)?(?:/replica:\d+)?(?:/task:\d+)?/?"
    r"(?:device:|physical_device:)?(?P<kind>[a-z]+)(?:[:_](?P<index>\d+))?$"
)
_EXAMPLES = "'cpu', 'gpu', 'gpu:1', 'cuda:1', '/GPU:1', '/device:GPU:1'"


@dataclasses.dataclass(frozen=True, eq=False)
class Device:
    """One device, named canonically, with what is known about it.

    Two devices are equal when their kind and index are equal; the other fields are
    facts about the device and do not take part in comparison.

    Attributes:
        kind: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        index: position among the devices of that kind visible to this process.
        name: the product name where known, e.g. ``"NVIDIA H200"``.
        vendor: ``"nvidia"``, ``"amd"``, ``"apple"``, the CPU vendor, or ``""``.
        memory_total: bytes, or None where unknown.
        memory_free: bytes, or None where unknown.
        compute_capability: ``(major, minor)`` for NVIDIA GPUs, else None.
        backends: names of the backends that can place arrays on this device.

    >>> Device("gpu", 1)
    Device('gpu:1')
    >>> str(device("cuda:1"))
    'gpu:1'
    """

    kind: str
    index: int = 0
    name: str = ""
    vendor: str = ""
    memory_total: int | None = None
    memory_free: int | None = None
    compute_capability: tuple[int, int] | None = None
    backends: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DeviceNotFound(
                message("Unknown device kind", expected="one of " + ", ".join(KINDS), received=self.kind, choices=KINDS)
            )
        if not isinstance(self.index, int) or isinstance(self.index, bool) or self.index < 0:
            raise DeviceNotFound(
                message(
                    "A device index must be a whole number from 0", received=self.index, fix=f"use e.g. '{self.kind}:0'"
                )
            )

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    def __repr__(self) -> str:
        facts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)[2:]
            if getattr(self, f.name) not in ("", None, ())
        ]
        return f"Device({str(self)!r}{''.join(', ' + f for f in facts)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    def with_facts(self, **facts: Any) -> Device:
        """A copy with some facts filled in (kind and index stay)."""
        return dataclasses.replace(self, **facts)


def device(spec: Any) -> Device:
    """Parse any device spelling into a canonical :class:`Device` (kind and index only).

    This names a device; it does not check that the device exists (``xdevice.devices()``
    and ``xdevice.on(..., soft=False)`` do that).

    Args:
        spec: a string in any framework's spelling, a ``Device``, a ``torch.device``,
            a JAX device, or a TensorFlow ``LogicalDevice``/``PhysicalDevice``.

    Raises:
        DeviceNotFound: the spelling is not a device name.

    >>> device("/job:localhost/replica:0/task:0/device:GPU:1")
    Device('gpu:1')
    >>> device("cpu")
    Device('cpu:0')
    """
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, str):
        return _parse_name(spec)
    from xdevice._registry import owner

    found = owner(spec)
    if found is not None and found[1] == "device":
        return found[0].device_from_native(spec)
    raise DeviceNotFound(
        message(
            "Cannot read a device from this value",
            expected=f"a device name like {_EXAMPLES}, or a torch/JAX/TensorFlow device object",
            received=f"{type(spec).__name__}: {spec!r}",
            fix="pass e.g. 'gpu:0' (an int is not accepted: write 'gpu:N')",
        )
    )


@functools.lru_cache(maxsize=512)  # a Device is immutable: one parse per spelling
def _parse_name(text: str) -> Device:
    match = _NAME.match(text.strip().lower())
    if match is None or match["kind"] not in _ALIASES:
        raise DeviceNotFound(
            message(
                "Not a device name",
                expected=f"a name like {_EXAMPLES}",
                received=text,
                choices=[f"{kind}:0" for kind in KINDS],
                fix="use 'kind:index' with kind one of cpu, gpu, tpu",
            )
        )
    return Device(_ALIASES[match["kind"]], int(match["index"] or 0))


def device_from_parts(kind: str, index: int, original: Any) -> Device:
    """The device of a framework's ``kind`` name (``"cuda"``, ``"GPU"``) and ``index``;
    ``original`` is what the user passed, for the error."""
    if kind.lower() not in _ALIASES:
        raise DeviceNotFound(
            message(
                "Unsupported device type", expected="one of " + ", ".join(sorted(_ALIASES)), received=repr(original)
            )
        )
    return Device(_ALIASES[kind.lower()], int(index))
