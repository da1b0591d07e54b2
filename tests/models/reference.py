"""What the real-scale zoo tests share: a transformers module with random weights, its outputs
as numpy, and the fp32 comparison (relative error <= 1e-4)."""

from __future__ import annotations

import numpy as np

from xdevice._tolerance import compare


def randomised(module, noise: float):
    """``module`` in eval mode with ``noise`` x normal added to every parameter: fresh norms are
    the identity and fresh biases zero, which would hide a swapped scale and offset, and the
    logits spread so that greedy generation does not repeat one token."""
    import torch

    with torch.no_grad():
        for value in module.parameters():
            value.add_(noise * torch.randn_like(value))
    return module.eval()


def logits(module, x, mask=None) -> np.ndarray:
    """The module's ``logits`` for ``x`` (token ids or images), with ``attention_mask`` when given."""
    import torch

    with torch.no_grad():
        given = {} if mask is None else {"attention_mask": torch.as_tensor(mask)}
        return module(torch.as_tensor(x), **given).logits.numpy()


def relative(actual, expected) -> float:
    """Normwise relative error of ``actual`` against ``expected``."""
    return float(np.linalg.norm(np.asarray(actual, np.float64) - expected) / np.linalg.norm(expected))


def assert_close(actual, expected) -> None:
    """fp32 against transformers: elementwise within xdevice's float32 row, and normwise <= 1e-4."""
    actual = np.asarray(actual)
    assert compare(actual, expected, "float32", scale=float(np.abs(expected).max())).ok, compare(actual, expected)
    assert relative(actual, expected) <= 1e-4
