"""PyTorch numerics: float32 matmul and cuDNN convolution precision, deterministic algorithms, seeds.

Precision is ``torch.set_float32_matmul_precision`` (the same three names as xdevice's) for
matrix products, plus cuDNN's TF32 switch for convolutions and RNNs, which PyTorch leaves on by
default: "highest" turns it off, "high" and "medium" leave TF32 on. The cuDNN switch is set
through ``torch.backends.cudnn.allow_tf32``, not the newer per-operator ``fp32_precision``:
once the newer API has set cuDNN, the ``allow_tf32`` getter raises ("a mix of the legacy and
new APIs"), and Inductor's GPU convolution template still reads it. What is in effect is read
back through the newer getters, which never raise.

``deterministic=True``: ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (read when CUDA starts: core has
refused a started CUDA), ``torch.use_deterministic_algorithms(True)`` (an operation without a
deterministic kernel then raises instead of varying), cuDNN's deterministic algorithms without
benchmarking, and one intra-op thread on the CPU (some kernels, LSTM weight gradients through
the BLAS among them, split their sums by thread count).
"""

from __future__ import annotations

import os

import torch

from xdevice._types import Applied, Config

_WORKSPACE = ":4096:8"  # or ":16:8": the two settings cuBLAS documents as deterministic


class Numerics:
    def configure_numerics(self, config: Config) -> list[Applied]:
        precision = config.matmul_precision or "highest"
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = precision != "highest"
        conv = "IEEE float32" if precision == "highest" else "TF32"
        rows = [
            Applied(
                "torch",
                "matmul_precision",
                precision,
                "applied",
                f"torch.set_float32_matmul_precision({precision!r}); cuDNN convolutions in {conv}",
            )
        ]
        if not config.deterministic:
            return rows + [Applied("torch", "deterministic", False, "applied", "PyTorch's defaults")]
        workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if workspace not in (":4096:8", ":16:8"):
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace = _WORKSPACE
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.set_num_threads(1)
        return rows + [
            Applied(
                "torch",
                "deterministic",
                True,
                "applied",
                f"use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG={workspace}, "
                "cudnn.deterministic=True, cudnn.benchmark=False, set_num_threads(1)",
            )
        ]

    def numerics(self) -> dict[str, object]:
        return {
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul": torch.backends.cuda.matmul.fp32_precision,
            "cudnn_conv": _resolved(torch.backends.cudnn.conv.fp32_precision),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "threads": torch.get_num_threads(),
        }

    def seed(self, n: int) -> None:
        torch.manual_seed(n)  # every device's generator, CUDA's included (lazily: CUDA is not started)


def _resolved(precision: str) -> str:
    """cuDNN's convolution precision: "none" defers to cuDNN's, then to PyTorch's, then IEEE."""
    for parent in (torch.backends.cudnn.fp32_precision, torch.backends.fp32_precision, "ieee"):
        if precision != "none":
            break
        precision = parent
    return precision
