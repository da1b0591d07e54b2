"""The numpy reference backend: CPU only, the ground truth that parity is measured against.

Importing this package imports nothing; ``NumpyBackend`` (``backend.py``) imports numpy.
"""

#: the framework's name for people, read by the backend class and by the registry (no import)
TITLE = "NumPy"


def __getattr__(name: str):
    if name == "NumpyBackend":  # the class loads the framework: only when asked for
        from xdevice.backends.numpy.backend import NumpyBackend

        return NumpyBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
