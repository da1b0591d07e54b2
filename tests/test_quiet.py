"""No framework start-up line reaches the terminal unless asked for (``xdevice._quiet``).

TensorFlow 2.21 prints absl's ``WARNING: All log messages before absl::InitializeLog() ...``
and ``port.cc:153] oneDNN custom operations are on ...`` (twice: two of its libraries carry that
code) whatever ``TF_CPP_MIN_LOG_LEVEL`` says. It turns oneDNN on by default only on some CPUs,
so the tests turn it on (``TF_ENABLE_ONEDNN_OPTS=1``): then TensorFlow prints on every x86-64
Linux machine, and a quiet stderr proves something.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from xdevice import _quiet, _registry

ONEDNN = "oneDNN custom operations are on"

needs_tensorflow = pytest.mark.skipif(not _registry.is_installed("tensorflow"), reason="TensorFlow is not installed")
chatty = pytest.mark.skipif(
    not (sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")),
    reason="TensorFlow's oneDNN start-up line is printed on x86-64 Linux",
)


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``args`` in a fresh interpreter with TensorFlow's oneDNN on and no verbosity asked for."""
    merged = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", _quiet.VERBOSE_VARIABLE)}
    merged.update(TF_ENABLE_ONEDNN_OPTS="1", **env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=merged, timeout=300)


@needs_tensorflow
@pytest.mark.parametrize("command", [["doctor"]], ids=" ".join)  # devices: tests/test_cli.py
def test_commands_print_nothing_on_stderr(command):
    result = _run("-m", "xdevice", *command)
    assert result.returncode in (0, 1), result.stderr  # doctor exits 1 when it finds a problem
    assert result.stderr == ""
    assert "tensorflow" in result.stdout.lower()  # TensorFlow was loaded: there was chatter to hide


@needs_tensorflow
@chatty
@pytest.mark.parametrize(
    "flags, env", [(["--verbose"], {}), ([], {_quiet.VERBOSE_VARIABLE: "1"})], ids=["--verbose", "XDEVICE_VERBOSE=1"]
)
def test_asking_for_verbose_output_shows_the_start_up_lines(flags, env):
    result = _run("-m", "xdevice", *flags, "devices", **env)
    assert result.returncode == 0, result.stderr
    assert ONEDNN in result.stderr


@needs_tensorflow
@chatty
def test_python_use_is_quiet_and_keeps_the_lines_for_logging():
    code = """
        import logging, xdevice
        from xdevice import _quiet
        logged = []
        class Keep(logging.Handler):
            def emit(self, record):
                logged.append(record.getMessage())
        logger = logging.getLogger("xdevice.backends.tensorflow")
        logger.addHandler(Keep())
        logger.setLevel(logging.DEBUG)
        xdevice.backend("tensorflow")
        captured = _quiet.captured("tensorflow").splitlines()
        print(sum("oneDNN" in line for line in logged), sum("oneDNN" in line for line in captured))
    """
    result = _run("-c", textwrap.dedent(code))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    logged, captured = map(int, result.stdout.split())
    assert logged == captured >= 1


def test_lines_written_to_the_descriptor_are_captured_not_printed(capfd, monkeypatch):
    monkeypatch.delenv(_quiet.VERBOSE_VARIABLE, raising=False)
    with _quiet.quiet_stderr("example-quiet"):
        os.write(2, b"a C++ library says hello\n")
    assert capfd.readouterr().err == ""
    assert _quiet.captured("example-quiet") == "a C++ library says hello\n"


def test_a_load_that_fails_shows_what_it_printed(capfd, monkeypatch):
    monkeypatch.delenv(_quiet.VERBOSE_VARIABLE, raising=False)
    with pytest.raises(ImportError), _quiet.quiet_stderr("example-failing"):
        os.write(2, b"libcudnn.so.9: cannot open shared object file\n")
        raise ImportError("no cudnn")
    assert "libcudnn.so.9" in capfd.readouterr().err
