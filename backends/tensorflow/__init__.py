"""The TensorFlow backend.

Importing this package imports nothing: ``TensorflowBackend`` (``backend.py``) imports
tensorflow (which starts no runtime), and :func:`gpu_build` answers from package metadata.
"""

import importlib.metadata
import sys


def gpu_build() -> bool:
    """Whether the installed TensorFlow supports GPUs: ``tensorflow`` on Linux does,
    ``tensorflow-cpu`` does not (asked of TensorFlow itself once it is imported)."""
    if "tensorflow" in sys.modules:
        return bool(sys.modules["tensorflow"].test.is_built_with_cuda())
    try:
        importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return False
    return sys.platform == "linux"


def __getattr__(name: str):
    if name == "TensorflowBackend":  # the class loads the framework: only when asked for
        from xdevice.backends.tensorflow.backend import TensorflowBackend

        return TensorflowBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
