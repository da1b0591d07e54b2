"""NumPy numerics: one precision (IEEE float32, the reference), deterministic kernels, one global seed.

NumPy's BLAS computes float32 products in float32 whatever is asked, so a lower precision is
reported as skipped; its kernels give the same bits run after run, so nothing needs switching
on for determinism.
"""

from __future__ import annotations

import numpy as np

from xdevice._types import Applied, Config


class Numerics:
    def configure_numerics(self, config: Config) -> list[Applied]:
        precision = config.matmul_precision or "highest"
        return [
            Applied(
                "numpy",
                "matmul_precision",
                precision,
                "applied" if precision == "highest" else "skipped",
                "numpy always computes float32 products in IEEE float32 (the reference)",
            ),
            Applied(
                "numpy",
                "deterministic",
                bool(config.deterministic),
                "applied",
                "numpy's kernels are deterministic: nothing to switch on",
            ),
        ]

    def numerics(self) -> dict[str, object]:
        return {"matmul_precision": "highest", "deterministic": True}

    def seed(self, n: int) -> None:
        np.random.seed(n)
