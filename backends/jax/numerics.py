"""JAX numerics: ``jax_default_matmul_precision``, XLA's deterministic GPU kernels, no global seed.

xdevice's names map to JAX's legacy precision values: "highest" to ``highest`` (float32),
"high" to ``high`` (TF32 on an NVIDIA GPU, three bfloat16 passes on a TPU), "medium" to
``bfloat16`` (XLA's DEFAULT precision: one bfloat16 pass on a TPU, TF32 on an NVIDIA GPU, which
has no faster float32 mode). The setting applies to matrix products and convolutions of
functions traced afterwards; XLA's CPU ignores it (always float32).

``deterministic=True`` adds ``--xla_gpu_deterministic_ops=true`` to ``XLA_FLAGS``, which XLA
reads when JAX's backends start (core has refused a started JAX). XLA's CPU kernels already
give the same bits at any thread count, so nothing else is needed there. JAX has no global
random state: its keys are explicit, drawn from xdevice's seed.
"""

from __future__ import annotations

import os

import jax

from xdevice._types import Applied, Config

_JAX_NAMES = {"highest": "highest", "high": "high", "medium": "bfloat16"}
_FLAG = "--xla_gpu_deterministic_ops=true"


class Numerics:
    def configure_numerics(self, config: Config) -> list[Applied]:
        precision = config.matmul_precision or "highest"
        jax.config.update("jax_default_matmul_precision", _JAX_NAMES[precision])
        rows = [
            Applied(
                "jax",
                "matmul_precision",
                precision,
                "applied",
                f"jax_default_matmul_precision={_JAX_NAMES[precision]!r} (for functions traced from now on)",
            )
        ]
        if not config.deterministic:
            return rows + [Applied("jax", "deterministic", False, "applied", "XLA's defaults")]
        flags = os.environ.get("XLA_FLAGS", "")
        if _FLAG not in flags.split():
            os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}".strip()
        return rows + [
            Applied(
                "jax",
                "deterministic",
                True,
                "applied",
                f"XLA_FLAGS+={_FLAG}, read when JAX starts (XLA's CPU kernels are thread-count invariant)",
            )
        ]

    def numerics(self) -> dict[str, object]:
        return {
            "matmul_precision": jax.config.jax_default_matmul_precision,
            "deterministic": _FLAG in os.environ.get("XLA_FLAGS", "").split(),
        }

    def seed(self, n: int) -> None:
        return None  # no global random state: xdevice's own keys come from its default seed
