"""The layer map holds: only backends/<name>/ imports a framework, each layer imports only
the layers below it, and the floor (xdevice/_*.py) imports nothing above it (import-linter's
contracts in pyproject.toml, on the package as installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint(tmp_path: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run import-linter over the package assembled as pyproject's package-dir installs it
    (grimp reads folders, and backends/ and converters/ live outside xdevice/), with ``extra``
    lines appended to some of its files."""
    package = tmp_path / "xdevice"
    ignore = shutil.ignore_patterns("__pycache__")
    # xdevice/backends and xdevice/converters are links to the top-level folders: copied below, writable
    shutil.copytree(ROOT / "xdevice", package, ignore=shutil.ignore_patterns("__pycache__", "backends", "converters"))
    shutil.copytree(ROOT / "backends", package / "backends", ignore=ignore)
    shutil.copytree(ROOT / "converters", package / "converters", ignore=ignore)
    for path, line in (extra or {}).items():
        with open(package / path, "a", encoding="utf-8") as source:
            source.write(f"\n{line}\n")
    command = [
        str(Path(sys.executable).with_name("lint-imports")),
        "--config",
        str(ROOT / "pyproject.toml"),
        "--no-cache",
    ]
    return subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )


def test_the_layer_contracts_are_kept(tmp_path):
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


def test_every_floor_module_is_held_by_the_floor_contract():
    """A new xdevice/_*.py is on the floor: the contract lists it, or it could import anything."""
    import tomllib  # Python 3.11, as import-linter itself

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    floor = next(c for c in linter["contracts"] if c["name"].startswith("The floor"))
    modules = {f"xdevice.{path.stem}" for path in (ROOT / "xdevice").glob("_*.py") if not path.stem.startswith("__")}
    assert sorted(floor["source_modules"]) == sorted(modules)


@pytest.mark.parametrize(
    "path, line, broken",
    [
        ("_tensors.py", "import torch", "xdevice._tensors is not allowed to import torch"),
        ("converters/formats.py", "import jax", "xdevice.converters.formats is not allowed to import jax"),
        ("backends/torch/__init__.py", "import torch", "xdevice.backends.torch is not allowed to import torch"),
        (
            "backends/jax/replication.py",
            "import xdevice.training.trainer",
            "xdevice.backends.jax.replication -> xdevice.training.trainer",
        ),
        ("_placement.py", "import xdevice.training.trainer", "xdevice._placement -> xdevice.training.trainer"),
        ("_tensors.py", "import xdevice.models", "xdevice._tensors -> xdevice.models"),
        ("_registry.py", "import xdevice.backends.numpy", "xdevice._registry -> xdevice.backends.numpy"),
    ],
)
def test_a_forbidden_import_breaks_the_build(tmp_path, path, line, broken):
    result = lint(tmp_path, {path: line})
    assert result.returncode != 0 and "1 broken" in result.stdout
    assert broken in " ".join(result.stdout.split()), result.stdout[-3000:]


def test_loading_any_backend_loads_no_training_module_and_joins_nothing(run_python):
    """Even in a process xdevice launch started: joining is explicit (xdevice.join_processes)."""
    launched = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "9",
        "XDEVICE_COORDINATOR": "127.0.0.1:10",
        "TF_CONFIG": json.dumps(
            {"cluster": {"worker": ["127.0.0.1:11", "127.0.0.1:12"]}, "task": {"type": "worker", "index": 0}}
        ),
    }
    result = run_python(
        """
        import json, sys
        import xdevice
        for name in xdevice.backends():
            xdevice.backend(name).ops
        training = sorted(m for m in sys.modules if m.startswith("xdevice.training"))
        joined = []
        if "jax" in sys.modules:
            import jax
            joined.append(jax.distributed.is_initialized())
        print(json.dumps([training, joined]))
    """,
        env=launched,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    training, joined = json.loads(result.stdout)
    assert training == [] and not any(joined)


def test_importing_a_backend_package_imports_no_framework(run_python):
    """A backend package's __init__ stays framework-free (its class, in backend.py, does not)."""
    result = run_python("""
        import json, sys
        import xdevice
        from xdevice import _registry
        for name in xdevice.backends():
            __import__(f"xdevice.backends.{name}")
            _registry.gpu_build(name)
        heavy = ["torch", "jax", "jaxlib", "tensorflow", "keras", "numpy"]
        print(json.dumps([m for m in heavy if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == []
