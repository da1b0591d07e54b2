"""The JAX backend.

Importing this package imports nothing: ``JaxBackend`` (``backend.py``) imports jax (which
starts no runtime), and :func:`gpu_build` answers from what is installed.
"""

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

#: the framework's name for people, read by the backend class and by the registry (no import)
TITLE = "JAX"


def gpu_build() -> bool:
    """Whether JAX can use NVIDIA GPUs: a CUDA plugin (``jax-cuda12-plugin`` and the like,
    found as ``jax_plugins/xla_cuda*`` or ``jax_cuda*_plugin``) or an old ``+cuda`` jaxlib."""
    if sys.platform != "linux":
        return False
    spec = importlib.util.find_spec("jax_plugins")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if any(Path(folder).glob("xla_cuda*")):
            return True
    if any(importlib.util.find_spec(f"jax_cuda{v}_plugin") is not None for v in (12, 13)):
        return True
    try:
        return "+cuda" in importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False


def __getattr__(name: str):
    if name == "JaxBackend":  # the class loads the framework: only when asked for
        from xdevice.backends.jax.backend import JaxBackend

        return JaxBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
