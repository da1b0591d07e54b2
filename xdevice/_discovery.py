"""Device discovery: what the machine has, and what each framework sees of it.

The machine view starts no framework's runtime: CPUs come from the operating system and
NVIDIA GPUs from NVML (``nvidia-ml-py``, else ``nvidia-smi``), so it can run before ``configure``. Which
backends can use a GPU each backend package tells from its installed build (package
metadata: ``_registry.gpu_build``), without importing the framework.

A framework's own view (``devices(backend="jax")``) asks the framework, which starts the
runtime of JAX and TensorFlow: configure first.

Both views are read once per process and kept: ``find``, ``to_device``, ``on`` and every other
hot call look devices up in memory, reading neither ``/proc`` nor NVML nor package metadata
again. ``configure()`` (which changes what is visible) and ``devices(refresh=True)`` read them
anew; facts that drift, such as free memory, are as of that reading (``memory_stats`` reads
them live).

GPU numbering: NVML numbers GPUs by PCI bus (as ``nvidia-smi`` does), the CUDA driver that
PyTorch, JAX and TensorFlow use fastest first unless ``CUDA_DEVICE_ORDER`` says otherwise,
so on a machine with mixed GPUs ``gpu:1`` could name one card here and another in the
frameworks. Importing xdevice therefore sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the user
chose an order (the one environment variable xdevice sets on import: it is read only when a
CUDA runtime starts, and makes every framework count as ``nvidia-smi``). Where the orders can
still differ (the user chose ``FASTEST_FIRST``, or a runtime started before xdevice was
imported), :func:`cuda_numbering` maps them by UUID as the CUDA driver reports them once a
runtime started it (asking does not start it); before that the fastest-first order cannot be
known, and discovery keeps the PCI order and warns once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import threading
import warnings
from typing import Any

from xdevice import _registry
from xdevice._device import KINDS, Device, device
from xdevice._errors import DeviceNotFound, message

__all__ = [
    "cuda_driver_started",
    "cuda_numbering",
    "devices",
    "find",
    "clear_cache",
    "machine_devices",
    "nvml_gpus",
    "nvml_physical_gpus",
    "smi_gpus",
    "visible_gpu_indices",
]

# CUDA reads this when its runtime starts (the driver's cuInit): set before any can, and only
# where the user said nothing, so an explicit FASTEST_FIRST stands (then cuda_numbering maps)
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

_views: dict[str | None, list[Device]] = {}  # None: the machine; a name: that framework's view
_found: dict[tuple[object, str | None], Device] = {}  # (spec as given, backend) -> the device
_lock = threading.Lock()


def devices(kind: str | None = None, backend: str | None = None, *, refresh: bool = False) -> list[Device]:
    """The devices of this machine, or the ones one framework sees.

    Args:
        kind: keep only ``"cpu"``, ``"gpu"`` or ``"tpu"`` devices.
        backend: ask this framework for its own view (starts the runtime of JAX and
            TensorFlow). Without it, discovery starts no framework.
        refresh: read the machine and every framework's view again (they are read once per
            process otherwise; ``configure`` refreshes them too).

    >>> [str(d) for d in devices(kind="cpu")][:1]
    ['cpu:0']
    """
    if kind is not None and kind not in KINDS:
        raise DeviceNotFound(message("Unknown device kind", received=kind, choices=KINDS))
    if refresh:
        clear_cache()
    found = _view(backend)
    return [d for d in found if kind is None or d.kind == kind]


def clear_cache() -> None:
    """Forget what discovery read: the next look-up reads the machine, the frameworks and the
    registered backends anew."""
    with _lock:
        _views.clear()
        _found.clear()
    _registry.forget_installed()


def _view(backend: str | None) -> list[Device]:
    found = _views.get(backend)
    if found is None:
        if backend is None:
            found = machine_devices()
        else:
            facts = {d: d for d in _view(None)}
            found = [_merge(d, facts.get(d), backend) for d in _registry.backend(backend).list_devices()]
        with _lock:
            found = _views.setdefault(backend, found)
    return found


def find(spec: object, backend: str | None = None) -> Device:
    """The existing device named by ``spec``, with its facts.

    Raises:
        DeviceNotFound: it does not exist; the message lists those that do and the
            nearest name.

    >>> find("cpu")  # doctest: +ELLIPSIS
    Device('cpu:0'...)
    >>> str(find("/device:CPU:0"))
    'cpu:0'
    """
    try:
        return _found[spec, backend]
    except (KeyError, TypeError):  # not seen yet, or a spec that cannot be a key
        pass
    wanted = device(spec)
    present = _view(backend)
    for candidate in present:
        if candidate == wanted:
            with contextlib.suppress(TypeError):
                _found[spec, backend] = candidate
            return candidate
    seen_by = f"backend {backend!r}" if backend else "this machine"
    raise DeviceNotFound(
        message(
            f"No device {wanted} on {seen_by}",
            expected="one of the devices that exist",
            received=str(spec),
            choices=[str(d) for d in present],
            fix=_virtual_cpu_fix(wanted, backend)
            or "pass one of those (xdevice.devices() lists them); only xdevice.on(..., soft=True) falls back "
            "to the CPU by itself",
        )
    )


def _virtual_cpu_fix(wanted: Device, backend: str | None) -> str | None:
    """For ``cpu:N`` (N > 0), the fix that makes it: virtual CPU devices, which exist only
    once ``configure(cpu_devices=...)`` split the CPU, and only in a framework that can."""
    if wanted.kind != "cpu" or wanted.index == 0:
        return None
    count = wanted.index + 1
    able = [name for name in ("jax", "tensorflow") if name in _registry.backends()]
    if backend is None:
        return (
            f"call xdevice.configure(cpu_devices={count}) first, then name the framework that splits the CPU "
            f"(backend={able[0] if able else 'jax'!r}): the machine itself has one CPU device"
        )
    if _registry.backend(backend).supports_virtual_devices:
        return (
            f"call xdevice.configure(cpu_devices={count}) at the top of the program, before "
            f"{_registry.title(backend)} starts: it splits the CPU into {count} devices"
        )
    launch = (
        f", or one process per device: xdevice launch --nproc-per-node {count}"
        if backend in _registry.providers("agent")
        else ""
    )
    return (
        f"{_registry.title(backend)} has one CPU device: xdevice.configure(cpu_devices={count}) splits the CPU "
        f"for {' and '.join(able) or 'JAX and TensorFlow'}; for {backend!r} use cpu:0{launch}"
    )


def machine_devices() -> list[Device]:
    """CPU and GPUs of this machine, from the OS and NVML; starts no framework."""
    installed = _registry.backends()
    cpu = _cpu().with_facts(backends=tuple(installed))
    gpu_users = tuple(name for name in installed if _registry.gpu_build(name))
    gpus = [gpu.with_facts(backends=gpu_users) for gpu in nvml_gpus()]
    if not gpus:
        gpus = _gpus_from_running_frameworks()
    return [cpu, *gpus]


def _merge(seen: Device, facts: Device | None, backend: str) -> Device:
    """A framework's device, with machine facts filled in where the framework gave none."""
    fill = {}
    if facts is not None:
        for field in ("name", "vendor", "memory_total", "memory_free", "compute_capability"):
            if getattr(seen, field) in ("", None):
                fill[field] = getattr(facts, field)
    return seen.with_facts(backends=(backend,), **fill)


# -- CPU ----------------------------------------------------------------------------------


def _cpu() -> Device:
    info = _read_keyed("/proc/cpuinfo", ":")
    memory = _read_keyed("/proc/meminfo", ":")
    total = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    free = int(memory["MemAvailable"].split()[0]) * 1024 if "MemAvailable" in memory else None
    vendor = info.get("vendor_id", "")
    return Device(
        "cpu",
        0,
        name=info.get("model name") or platform.processor() or platform.machine(),
        vendor=_VENDORS.get(vendor, vendor.lower()),
        memory_total=total,
        memory_free=free,
    )


def _read_keyed(path: str, separator: str) -> dict[str, str]:
    """First value of each key in a ``key: value`` file such as /proc/cpuinfo ({} if absent)."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(separator)
                found.setdefault(key.strip(), value.strip())
    return found


_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


# -- NVIDIA GPUs through NVML ---------------------------------------------------------------


def nvml_gpus() -> list[Device]:
    """NVIDIA GPUs visible to this process, numbered as CUDA will number them.

    Empty when NVML or its driver library is missing. Honours ``CUDA_VISIBLE_DEVICES``
    (indices or UUIDs), which NVML itself ignores.
    """
    physical = nvml_physical_gpus()
    uuids = [uuid for uuid, _ in physical]
    # with one GPU both orders agree; with more, the driver's own numbering once a runtime started it
    order = cuda_numbering(uuids, runtime_uuids=_driver_uuids() if len(uuids) > 1 else None)
    if order is None:
        order = visible_gpu_indices(uuids)
        _warn_order_unknown(os.environ.get("CUDA_DEVICE_ORDER", ""))
    return [Device("gpu", new, **physical[old][1]) for new, old in enumerate(order)]


def cuda_numbering(
    nvml_uuids: list[str],
    *,
    device_order: str | None = None,
    visible: str | None = None,
    runtime_uuids: list[str] | None = None,
) -> list[int] | None:
    """Physical (NVML, PCI-bus) GPU indices in the order CUDA numbers the visible GPUs.

    Args:
        nvml_uuids: the GPUs' UUIDs as NVML lists them (``nvml_physical_gpus``).
        device_order: ``CUDA_DEVICE_ORDER`` (default: the environment's; CUDA's own default,
            when unset, is ``FASTEST_FIRST``).
        visible: ``CUDA_VISIBLE_DEVICES`` (default: the environment's).
        runtime_uuids: the UUIDs of the devices the CUDA driver numbered in this process, in
            its order, once a runtime started it: then they decide, whatever the variables say.

    Returns:
        The indices, or None where CUDA's numbering cannot be known yet: ``FASTEST_FIRST`` with
        more than one GPU and no runtime started (CUDA ranks GPUs by a heuristic it does not
        document, and reads the numbers in ``CUDA_VISIBLE_DEVICES`` in that order too).

    >>> cuda_numbering(["GPU-a", "GPU-b"], device_order="PCI_BUS_ID", visible="1")
    [1]
    >>> cuda_numbering(["GPU-a", "GPU-b"], device_order="FASTEST_FIRST", visible=None) is None
    True
    >>> cuda_numbering(["GPU-a", "GPU-b"], device_order="FASTEST_FIRST", runtime_uuids=["b", "a"])
    [1, 0]
    """
    if runtime_uuids is not None:
        keys = [_uuid_key(u) for u in nvml_uuids]
        try:
            return [keys.index(_uuid_key(u)) for u in runtime_uuids]
        except ValueError:  # a device NVML does not list as a GPU (a MIG slice): the orders below
            pass
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") if device_order is None else device_order
    if order.strip().upper() != "PCI_BUS_ID" and sum(not _is_mig(u) for u in nvml_uuids) > 1:
        return None
    return visible_gpu_indices(nvml_uuids, env=visible)


def _is_mig(uuid: str) -> bool:
    """Whether NVML's ``uuid`` names a MIG slice (``MIG-...``) rather than a whole GPU (``GPU-...``)."""
    return uuid.strip().upper().startswith("MIG-")


def _uuid_key(uuid: str) -> str:
    """A GPU UUID as both spell it: NVML ``GPU-58d6...``, PyTorch and the driver bare hex."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith(("gpu-", "mig-")) else uuid


_warned_order: set[str] = set()


def _warn_order_unknown(order: str) -> None:
    if order in _warned_order:
        return
    _warned_order.add(order)
    warnings.warn(
        message(
            "xdevice numbers GPUs by PCI bus (as nvidia-smi), but CUDA_DEVICE_ORDER asks CUDA to number them "
            "fastest first, so gpu:N may name another card in PyTorch, JAX and TensorFlow until one of them "
            "starts (then xdevice reads CUDA's own numbering)",
            received=f"CUDA_DEVICE_ORDER={order or '(unset: FASTEST_FIRST)'}",
            fix="unset CUDA_DEVICE_ORDER or set it to PCI_BUS_ID before the program starts, or name GPUs "
            "in CUDA_VISIBLE_DEVICES by UUID (nvidia-smi -L)",
        ),
        RuntimeWarning,
        stacklevel=3,
    )


def cuda_driver_started() -> bool:
    """Whether the CUDA driver was initialised (``cuInit``) in this process, by any framework or
    library: ``torch.cuda.is_available()`` does it, as does any first use of a GPU. From then on
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` are fixed for the whole process, whatever
    the variables say later. Asking starts nothing (before ``cuInit``, ``cuDeviceGetCount``
    answers CUDA_ERROR_NOT_INITIALIZED); False where there is no CUDA driver.

    >>> isinstance(cuda_driver_started(), bool)
    True
    """
    import ctypes

    cuda = _libcuda()
    return cuda is not None and cuda.cuDeviceGetCount(ctypes.byref(ctypes.c_int())) == 0


@functools.lru_cache(maxsize=1)
def _libcuda() -> Any:
    """The CUDA driver library through ctypes (loading it initialises nothing), or None without one."""
    import ctypes  # only when asked: not at `import xdevice`

    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def _driver_uuids() -> list[str] | None:
    """UUIDs of the GPUs the CUDA driver numbered in this process, in its order; None when no
    runtime started the driver yet (asking does not start it: before ``cuInit`` every call
    answers CUDA_ERROR_NOT_INITIALIZED), or there is no driver."""
    import ctypes

    cuda = _libcuda()
    if cuda is None:
        return None
    count = ctypes.c_int()
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    found = []
    for index in range(count.value):
        handle, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        if cuda.cuDeviceGet(ctypes.byref(handle), index) != 0 or cuda.cuDeviceGetUuid(raw, handle) != 0:
            return None
        found.append(_uuid_text(bytes(raw)))
    return found


def _uuid_text(raw: bytes) -> str:
    """The driver's 16 UUID bytes as NVML spells them: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``.

    >>> _uuid_text(bytes(range(16)))
    'GPU-00010203-0405-0607-0809-0a0b0c0d0e0f'
    """
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def nvml_physical_gpus() -> list[tuple[str, dict[str, Any]]]:
    """``(uuid, facts)`` for every NVIDIA GPU in physical order, ignoring visibility: the whole
    GPUs (``GPU-...``) by PCI bus, which the numbers in ``CUDA_VISIBLE_DEVICES`` index, then the
    MIG slices of GPUs in MIG mode (``MIG-...``, CUDA knows them only by UUID), each with its
    own memory (on the GPU's handle NVML reports the whole card's).

    From NVML (``nvidia-ml-py``); without that package, from ``nvidia-smi``, which reads the
    same library (a GPU machine whose Python has CUDA frameworks but not the ``nvml`` extra
    still has a driver with it; there a slice's memory is its profile's nominal size).
    """
    try:
        import pynvml
    except ImportError:
        return _smi_physical_gpus()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    physical, slices = [], []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                capability = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
            except pynvml.NVMLError:
                capability = None
            physical.append(
                (
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    dict(
                        name=_text(pynvml.nvmlDeviceGetName(handle)),
                        vendor="nvidia",
                        memory_total=int(memory.total),
                        memory_free=int(memory.free),
                        compute_capability=capability,
                    ),
                )
            )
            slices += _nvml_mig_slices(pynvml, handle, physical[-1][1])
    except pynvml.NVMLError:
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return physical + slices


def _nvml_mig_slices(pynvml: Any, gpu: Any, card: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(uuid, facts)`` for each MIG slice of one GPU (its UUID, name and memory; the card's
    compute capability); [] when MIG is off or the GPU or driver has none."""
    try:
        if pynvml.nvmlDeviceGetMigMode(gpu)[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        most = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    except pynvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
        return []
    found = []
    for index in range(most):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            facts = dict(card, name=_text(pynvml.nvmlDeviceGetName(handle)))
            facts.update(memory_total=int(memory.total), memory_free=int(memory.free))
            found.append((_text(pynvml.nvmlDeviceGetUUID(handle)), facts))
        except pynvml.NVMLError:  # NOT_FOUND: no slice at this index
            continue
    return found


_SMI_FIELDS = "uuid,name,memory.total,memory.free,compute_cap"


def _smi_physical_gpus() -> list[tuple[str, dict[str, Any]]]:
    """What :func:`nvml_physical_gpus` reads, from ``nvidia-smi`` (PCI-bus order, as NVML): the
    whole GPUs from its query interface, then the MIG slices ``nvidia-smi -L`` lists under them
    (the query interface has no row for a slice)."""
    cards = smi_gpus(_run_smi(f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"))
    return cards + smi_mig_slices(_run_smi("-L"), cards) if cards else []


def _run_smi(*arguments: str) -> str:
    """``nvidia-smi``'s output for ``arguments``; empty where it is missing, fails or hangs."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        done = subprocess.run([smi, *arguments], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


_SMI_CARD = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[^)\s]+)\)")
_SMI_SLICE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)\s]+)\)")


def smi_mig_slices(listing: str, cards: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """``(uuid, facts)`` for each MIG slice in ``nvidia-smi -L`` output (``  MIG 1g.10gb  Device  0:
    (UUID: MIG-...)`` under its GPU's line), with its card's facts from ``cards``
    (:func:`smi_gpus`), named ``<card> MIG <profile>``. Its memory is the profile's nominal size
    (``1g.10gb``: 10 GB, 10**9 bytes each, which a slice always has; nvidia-smi reports no
    per-slice memory in a form to read), its free memory unknown.

    >>> cards = smi_gpus("GPU-a, NVIDIA H100 80GB HBM3, 81559, 81000, 9.0")
    >>> listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\\n  MIG 1g.10gb  Device  0: (UUID: MIG-b)"
    >>> [(uuid, facts["name"], facts["memory_total"]) for uuid, facts in smi_mig_slices(listing, cards)]
    [('MIG-b', 'NVIDIA H100 80GB HBM3 MIG 1g.10gb', 10000000000)]
    """
    facts_of = dict(cards)
    found: list[tuple[str, dict[str, Any]]] = []
    card: dict[str, Any] | None = None
    for line in listing.splitlines():
        if whole := _SMI_CARD.match(line):
            card = facts_of.get(whole.group(1))
        elif (part := _SMI_SLICE.match(line)) and card is not None:
            profile, uuid = part.groups()
            size = re.search(r"(\d+)gb", profile)
            found.append(
                (
                    uuid,
                    dict(
                        card,
                        name=f"{card['name']} MIG {profile}",
                        memory_total=int(size.group(1)) * 10**9 if size else None,
                        memory_free=None,
                    ),
                )
            )
    return found


def smi_gpus(table: str) -> list[tuple[str, dict[str, Any]]]:
    """``nvidia-smi --query-gpu=uuid,name,memory.total,memory.free,compute_cap
    --format=csv,noheader,nounits`` read as :func:`nvml_physical_gpus` answers (memory in MiB).

    >>> smi_gpus("GPU-a, NVIDIA H100 80GB HBM3, 81559, 81000, 9.0")[0][1]["compute_capability"]
    (9, 0)
    """
    found = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not cells[0]:
            continue
        uuid, name, total, free, capability = cells
        major, _, minor = capability.partition(".")
        found.append(
            (
                uuid,
                dict(
                    name=name,
                    vendor="nvidia",
                    memory_total=int(total) * 2**20 if total.isdigit() else None,
                    memory_free=int(free) * 2**20 if free.isdigit() else None,
                    compute_capability=(int(major), int(minor)) if major.isdigit() and minor.isdigit() else None,
                ),
            )
        )
    return found


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def visible_gpu_indices(uuids: list[str], env: str | None = None) -> list[int]:
    """Indices into ``uuids`` (:func:`nvml_physical_gpus`: whole GPUs, then MIG slices) of the
    GPUs ``CUDA_VISIBLE_DEVICES`` makes visible, in its order.

    Its entries are numbers, read as PCI-bus indices of whole GPUs, as CUDA reads them under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (which importing xdevice sets; see :func:`cuda_numbering`),
    or UUIDs (``GPU-...``, ``MIG-...``) or a prefix naming one of them only. CUDA stops at the
    first entry it cannot read, and so does this. Unset, it shows the whole GPUs.

    >>> visible_gpu_indices(["GPU-a", "GPU-b", "GPU-c"], env="2,GPU-a")
    [2, 0]
    >>> visible_gpu_indices(["GPU-a", "GPU-b"], env="1,7,0")
    [1]
    >>> visible_gpu_indices(["GPU-a", "MIG-c0", "MIG-c1"], env="MIG-c1,1")  # a slice has no number
    [2]
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    whole = [i for i, uuid in enumerate(uuids) if not _is_mig(uuid)]
    if env is None:
        return whole
    order: list[int] = []
    for entry in (e.strip() for e in env.split(",")):
        if entry.isdigit() and int(entry) < len(whole):
            index = whole[int(entry)]
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in order:
            break
        order.append(index)
    return order


def _gpus_from_running_frameworks() -> list[Device]:
    """GPUs seen by frameworks whose runtime already started (asking them is free)."""
    seen: dict[Device, list[str]] = {}
    for backend in _registry.loaded_backends():
        if backend.runtime_started():
            for found in backend.list_devices():
                if found.kind != "cpu":
                    seen.setdefault(found, []).append(backend.name)
    return [d.with_facts(backends=tuple(names)) for d, names in seen.items()]


# -- installed distributions, for the doctor -----------------------------------------------------


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, str]:
    """Installed distributions and versions: read once (half a second with big frameworks)."""
    import importlib.metadata  # read on first use, not at `import xdevice` (30 ms)

    found = {}
    for dist in importlib.metadata.distributions():
        with contextlib.suppress(Exception):
            found[dist.metadata["Name"].lower().replace("_", "-")] = dist.version
    return found
