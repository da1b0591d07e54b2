"""Framework start-up chatter kept off the terminal: stderr's file descriptor captured while a
framework loads, the lines kept for whoever asks.

TensorFlow's shared libraries log from C++ while they load, through absl, before anything reads
``TF_CPP_MIN_LOG_LEVEL``: ``port.cc:153] oneDNN custom operations are on ...`` after absl's
``WARNING: All log messages before absl::InitializeLog() is called are written to STDERR``. Two
of its libraries (``libtensorflow_framework.so.2`` and the profiler's ``_pywrap_profiler_plugin``)
each carry their own copy of that code and of absl's logging state, so one ``import tensorflow``
prints the pair twice, from one process. Python's ``sys.stderr`` never sees those lines: only
redirecting file descriptor 2 catches them, which is what :func:`quiet_stderr` does.

Who sees the lines:

- nobody by default: ``xdevice`` commands and Python use alike;
- everyone, untouched, when verbose output is asked for: ``xdevice --verbose`` calls
  :func:`set_verbose`, which sets ``XDEVICE_VERBOSE=1`` (child processes inherit it), and a
  user may set that variable themselves;
- a Python user who asks through logging: each captured line is logged at DEBUG on the
  logger ``xdevice.backends.<framework>``; :func:`captured` returns them as text.

Redirecting a descriptor is process-wide: whatever any thread writes to stderr while a framework
loads is captured with it (and logged the same way). When loading fails, the captured text is
written to stderr before the error propagates, since it often says why.

Imports no framework, and nothing beyond the standard library.

>>> with quiet_stderr("example"):
...     pass
>>> captured("example")
''
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["VERBOSE_VARIABLE", "captured", "quiet_stderr", "set_verbose", "verbose"]

#: the environment variable that lets frameworks write to stderr as they like ("1")
VERBOSE_VARIABLE = "XDEVICE_VERBOSE"

_lock = threading.RLock()  # one redirection at a time; the same thread may nest
_depth = 0
_captured: dict[str, str] = {}


def verbose() -> bool:
    """Whether framework start-up lines go straight to stderr (``XDEVICE_VERBOSE`` is set and
    not ``0``)."""
    return os.environ.get(VERBOSE_VARIABLE, "0").strip().lower() not in ("", "0", "false", "no")


def set_verbose(on: bool = True) -> None:
    """Let frameworks loaded from now on (in this process and its children) write to stderr
    untouched, or capture them again with ``on=False``. ``xdevice --verbose`` calls it."""
    if on:
        os.environ[VERBOSE_VARIABLE] = "1"
    else:
        os.environ.pop(VERBOSE_VARIABLE, None)


def captured(framework: str | None = None) -> str:
    """The text captured while ``framework`` loaded (all frameworks, in load order, when None);
    empty when it printed nothing, was not loaded yet, or loaded verbosely."""
    with _lock:
        if framework is not None:
            return _captured.get(framework, "")
        return "".join(_captured.values())


@contextmanager
def quiet_stderr(framework: str) -> Iterator[None]:
    """Capture file descriptor 2 while the block runs (a framework's import), unless
    :func:`verbose`; keep the text under ``framework`` and log each line at DEBUG on
    ``xdevice.backends.<framework>``. Nested uses join the outer capture."""
    global _depth
    if verbose():
        yield
        return
    with _lock:
        if _depth:
            _depth += 1
            try:
                yield
            finally:
                _depth -= 1
            return
        import tempfile

        _flush()
        try:
            saved = os.dup(2)
        except OSError:  # no usable stderr descriptor (pythonw, a closed fd 2): nothing to hide
            yield
            return
        sink = tempfile.TemporaryFile()
        os.dup2(sink.fileno(), 2)
        _depth = 1
        failed = True
        try:
            yield
            failed = False
        finally:
            _depth = 0
            try:
                _flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            sink.close()
            _keep(framework, text, failed)


def _flush() -> None:
    """Python's own buffered stderr text goes out on the side of the redirection it was written on."""
    if sys.stderr is not None:  # pythonw has no stderr
        sys.stderr.flush()


def _keep(framework: str, text: str, failed: bool) -> None:
    if not text:
        return
    _captured[framework] = _captured.get(framework, "") + text
    if failed:  # the lines may say why loading failed: the user sees them with the error
        if sys.stderr is not None:
            sys.stderr.write(text)
            sys.stderr.flush()
        return
    import logging

    logger = logging.getLogger(f"xdevice.backends.{framework}")
    for line in text.splitlines():
        if line.strip():
            logger.debug("%s", line)
