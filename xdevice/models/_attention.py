"""The fused query-key-value projection of the zoo's transformers (``attn.qkv``), into heads."""

from __future__ import annotations

from typing import Any

__all__ = ["fused_heads"]


def fused_heads(ops: Any, y: Any, weight: Any, bias: Any, tokens: Any, heads: int, size: int) -> tuple[Any, Any, Any]:
    """``(q, k, v)``, each ``(rows, heads, tokens, size)``, from ``y`` ``(rows, tokens, width)``
    through the fused projection ``attn.qkv`` (``bias`` may be None).

    The weight comes as saved, ``(width, 3 * width)`` with q, k and v side by side: one
    matmul, then the split. Tensor-parallel training holds it by its parts instead,
    ``(width, 3, width)`` with the bias ``(3, width)``
    (``xdevice.backends.training.tensor_parallel_shape``), split over devices along its last
    axis: then q, k and v are each a matmul with their part, so the columns a device holds are
    the heads it attends with and nothing moves between devices before attention (the one
    matmul would need the ``(width, 3 * width)`` weight put back together first).
    """
    if len(ops.shape(weight)) == 3:
        parts = [
            ops.linear(y, ops.take(weight, i, axis=1), None if bias is None else ops.take(bias, i, axis=0))
            for i in range(3)
        ]
    else:
        parts = ops.split(ops.linear(y, weight, bias), 3, axis=-1)
    return tuple(ops.transpose(ops.reshape(part, (-1, tokens, heads, size)), (0, 2, 1, 3)) for part in parts)
