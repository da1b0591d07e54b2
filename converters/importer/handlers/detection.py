"""Detection and scatter ops: NonMaxSuppression, RoiAlign, TensorScatter, and the rest of the
suite's ops that select or move values by computed indices."""

from __future__ import annotations
