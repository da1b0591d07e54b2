"""What training reports: per-step losses, per-epoch metrics, a PNG plot (progress is a callback).

>>> h = History()
>>> h.epochs.append({"epoch": 1, "loss": 0.5})
>>> h.last("loss")
0.5
"""

from __future__ import annotations

from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["History"]


class History:
    """``epochs``: one dict per epoch (``loss``, metrics, ``val_*``, ``input_wait``, ``seconds``);
    ``steps``: every step's loss. ``model``: the trained object (set by ``fit``)."""

    def __init__(self):
        self.epochs: list[dict[str, float]] = []
        self.steps: list[float] = []
        self.model: Any = None

    def last(self, key: str) -> float:
        return self.epochs[-1][key]

    def __getitem__(self, key: str) -> list[float]:
        """Keras's ``history.history[key]``: that value for every epoch."""
        return [epoch[key] for epoch in self.epochs if key in epoch]

    def plot(self, path: str, title: str = "training") -> str:
        """Write a PNG of the per-step loss and the per-epoch losses (needs matplotlib)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ConfigurationError(
                message("Plotting needs matplotlib", received="not installed", fix="pip install 'xdevice[plot]'")
            ) from None
        figure, axis = plt.subplots(figsize=(6, 4))
        axis.plot(range(1, len(self.steps) + 1), self.steps, label="loss per step", alpha=0.5)
        per_epoch = len(self.steps) / max(len(self.epochs), 1)
        for key in ("loss", "val_loss"):
            values = self[key]
            if values:
                axis.plot([per_epoch * (i + 1) for i in range(len(values))], values, "o-", label=f"{key} (epoch)")
        axis.set_xlabel("step")
        axis.set_ylabel("loss")
        axis.set_title(title)
        axis.legend()
        figure.tight_layout()
        figure.savefig(path, format="png")
        plt.close(figure)
        return path
