"""PyTorch memory: the CUDA caching allocator.

The allocator always grows on demand and cannot pre-allocate a pool. A limit becomes
``torch.cuda.set_per_process_memory_fraction`` on each GPU the limit applies to, which the
allocator enforces (an allocation past it raises out-of-memory).

Only the GPUs given a limit are touched. Setting a fraction initialises CUDA and opens a
context on that GPU (the allocator measures the GPU there, and leaves it the current one: the
GPU that was current is made current again). Facts that are only read come from NVML through
xdevice's discovery (``gpus``, ``Device.memory_total``), never from CUDA: asking CUDA whether it
has a GPU (``torch.cuda.is_available()``) runs ``cuInit``, which fixes ``CUDA_VISIBLE_DEVICES``
for the rest of the process, and a context on a GPU that another process holds in
EXCLUSIVE_PROCESS compute mode cannot be opened at all.
"""

from __future__ import annotations

import torch

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied


class Memory:
    _limits: dict[int, int]

    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        if not gpus or not torch.backends.cuda.is_built():  # is_built reads the build, starts nothing
            why = "no GPU" if not gpus else f"this PyTorch build ({torch.__version__}) has no CUDA"
            return memory_not_applied("torch", config, "skipped", why)
        entries = []
        if config.memory_growth is True:
            entries.append(
                Applied("torch", "memory_growth", True, "applied", "the caching allocator always grows on demand")
            )
        elif config.memory_growth is False:
            entries.append(
                Applied(
                    "torch", "memory_growth", False, "unsupported", "PyTorch's allocator cannot pre-allocate a pool"
                )
            )
        self._limits = getattr(self, "_limits", {})
        for gpu, limit, fraction in memory_fractions(config, gpus):
            try:
                with torch.cuda.device(gpu.index):  # on leaving, the GPU current before is current again
                    torch.cuda.set_per_process_memory_fraction(fraction, gpu.index)
            except RuntimeError as error:  # busy (EXCLUSIVE_PROCESS), or a driver CUDA cannot use
                raise ConfigurationError(
                    message(
                        f"PyTorch could not open {gpu} to set its memory limit",
                        received=str(error).splitlines()[0],
                        fix="give limits only to the GPUs this process uses "
                        f"(memory_limit={{'{gpu}': ...}} for one), or hide the others with configure(visible=...)",
                    )
                ) from error
            self._limits[gpu.index] = limit
            entries.append(
                Applied(
                    "torch",
                    "memory_limit",
                    limit,
                    "enforced",
                    f"set_per_process_memory_fraction({fraction:.4f}, {gpu.index})",
                )
            )
        return entries

    def memory_stats(self, device: Device) -> MemoryStats:
        if device.kind == "cpu":
            return cpu_only_stats("torch", device)
        # the limit set, else the GPU's size as NVML told discovery; CUDA is asked only once it
        # runs (mem_get_info would open a context on the GPU just to read its size)
        limit = getattr(self, "_limits", {}).get(device.index, device.memory_total)
        if limit is None and torch.cuda.is_initialized():
            limit = torch.cuda.get_device_properties(device.index).total_memory
        return MemoryStats(
            device,
            "torch",
            in_use=torch.cuda.memory_allocated(device.index),
            peak=torch.cuda.max_memory_allocated(device.index),
            limit=limit,
            limit_how="enforced",
        )

    def measure_step(self, step, args, device):
        if device.kind == "gpu":  # the caching allocator's peak over one real step
            index = device.index
            torch.cuda.synchronize(index)
            torch.cuda.reset_peak_memory_stats(index)
            before = torch.cuda.memory_allocated(index)
            step(*args)
            torch.cuda.synchronize(index)
            peak = torch.cuda.max_memory_allocated(index)
            return "CUDA's peak allocated over one step", {
                "before the step": before,
                "step": peak - before,
                "total": peak,
            }
        # on the CPU: what autograd keeps for the backward pass in one real step (storages
        # counted once; the parameters themselves are not extra), beside the arrays held
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(args)}
        saved: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in held:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            step(*args)
        parts = {"arguments": sum(held.values()), "saved for backward": sum(saved.values())}
        parts["total"] = parts["arguments"] + parts["saved for backward"]
        return "autograd's saved tensors in one step (saved_tensors_hooks)", parts


def memory_fractions(config: Config, gpus: list[Device]) -> list[tuple[Device, int, float]]:
    """``(gpu, limit in bytes, fraction of the GPU)`` for each GPU a limit applies to: the only
    GPUs ``configure_memory`` touches. A GPU whose size NVML did not report is left alone.

    >>> from xdevice._device import Device
    >>> gpus = [Device("gpu", 0, memory_total=8 * 2**30), Device("gpu", 1, memory_total=8 * 2**30)]
    >>> [(str(gpu), fraction) for gpu, _, fraction in memory_fractions(Config.make(memory_limit="2GiB"), gpus)]
    [('gpu:0', 0.25), ('gpu:1', 0.25)]
    """
    found = []
    for gpu in gpus:
        limit = config.limit_for(gpu)
        if limit is not None and gpu.memory_total is not None:
            found.append((gpu, limit, min(1.0, limit / gpu.memory_total)))
    return found


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)
