"""The TensorFlow backend.

Importing this package imports nothing: ``TensorflowBackend`` (``backend.py``) imports
tensorflow (which starts no runtime) with stderr's descriptor captured (``xdevice._quiet``: its
start-up lines reach the terminal only when asked for), and :func:`gpu_build` answers from
package metadata.
"""

import importlib.metadata
import sys

#: the framework's name for people, read by the backend class and by the registry (no import)
TITLE = "TensorFlow"


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
        from xdevice._quiet import quiet_stderr

        # TensorFlow's libraries log while they load, before TF_CPP_MIN_LOG_LEVEL is read (see _quiet)
        with quiet_stderr("tensorflow"):
            from xdevice.backends.tensorflow.backend import TensorflowBackend

        return TensorflowBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
