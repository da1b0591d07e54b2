"""PyTorch memory: the CUDA caching allocator.

The allocator always grows on demand and cannot pre-allocate a pool. A limit becomes
``torch.cuda.set_per_process_memory_fraction``, which the allocator enforces (an
allocation past it raises out-of-memory); setting it initialises CUDA.
"""

from __future__ import annotations

import torch

from xdevice._device import Device
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied


class Memory:
    _limits: dict[int, int]

    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        if not gpus or not torch.cuda.is_available():
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
        for gpu in gpus:
            limit = config.limit_for(gpu)
            if limit is None or gpu.memory_total is None:
                continue
            fraction = min(1.0, limit / gpu.memory_total)
            torch.cuda.set_per_process_memory_fraction(fraction, gpu.index)
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
        limit = getattr(self, "_limits", {}).get(device.index)
        if limit is None:
            limit = torch.cuda.mem_get_info(device.index)[1]
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


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _tensors(value)
