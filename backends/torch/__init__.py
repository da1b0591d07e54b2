"""The PyTorch backend.

Importing this package imports nothing: ``TorchBackend`` (``backend.py``) imports torch, and
:func:`gpu_build` answers from package metadata.
"""

import importlib.metadata
import sys

#: the framework's name for people, read by the backend class and by the registry (no import)
TITLE = "PyTorch"


def gpu_build() -> bool:
    """Whether the installed torch supports GPUs: a wheel tagged ``+cpu`` does not (asked of
    torch itself once it is imported)."""
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        return bool(torch.version.cuda or torch.version.hip)
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return False
    return "+cpu" not in version and sys.platform == "linux"


def __getattr__(name: str):
    if name == "TorchBackend":  # the class loads the framework: only when asked for
        from xdevice.backends.torch.backend import TorchBackend

        return TorchBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
