"""``seed``: one seed for Python, NumPy, every framework and xdevice's own draws.

``xdevice.seed(n)`` seeds Python's ``random`` and NumPy's global state at once, every framework
already imported through its backend's ``Backend.seed`` hook (``torch.manual_seed``, which seeds
the CPU and every CUDA device; TensorFlow's and Keras' global seeds), and each framework not
imported yet right after it first loads (the import hook ``xdevice.configure`` uses, so a
program pays for no framework it does not import). It also becomes xdevice's default seed: the
weights ``models.build`` draws, and the data order of ``fit`` and ``Batches``, when no ``seed=``
is given (0 until ``seed`` is called, so a program that never calls it draws as before).

Decisions:
- JAX has no global random state: its part is xdevice's own key stream, which the default
  seed covers (model initialisation and data order; the zoo trains without dropout).
- Data loading in xdevice runs in the calling process (one background thread places batches
  ahead), so there are no loader workers to seed; a ``torch.utils.data.DataLoader`` of the
  user's gets its workers' seeds from ``torch.manual_seed`` (torch draws each worker's
  ``base_seed`` from it).
- Seeding does not make kernels deterministic: ``xdevice.configure(deterministic=True)`` does.

Imports no framework, and NumPy only when ``seed`` is called.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import TYPE_CHECKING

from xdevice import _registry
from xdevice._errors import ConfigurationError, message

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = ["seed", "default_seed", "seed_backend", "waits_for"]

_seed: int | None = None  # what seed() set; None: never called
_seeded: dict[str, int] = {}  # backend -> the seed its framework got
_lock = threading.RLock()


def seed(n: int) -> None:
    """Seed Python's ``random``, NumPy, every framework and xdevice's default draws with ``n``.

    Frameworks imported later are seeded as they load. With
    ``xdevice.configure(deterministic=True)`` as well, a ``fit`` repeats bit for bit.

    Args:
        n: an int in ``[0, 2**32)`` (NumPy's range for its global seed).

    Raises:
        ConfigurationError: ``n`` is not such an int.

    >>> import random
    >>> seed(3)
    >>> first = random.random()
    >>> seed(3)
    >>> random.random() == first
    True
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**32:
        raise ConfigurationError(
            message(
                "The seed must be a non-negative int below 2**32 (NumPy's range)",
                expected="an int in [0, 2**32)",
                received=n,
                fix="write e.g. xdevice.seed(0)",
            )
        )
    from xdevice import _configure  # above this module: it waits on the import hook for us

    global _seed
    with _lock:
        _seed = n
        _seeded.clear()
    random.seed(n)
    import numpy

    numpy.random.seed(n)
    for name in _registry.backends():
        if name in sys.modules:  # imported: seed it now (creating its backend applies the seed)
            seed_backend(_registry.backend(name))
        else:
            with _configure._lock:
                _configure._watch(name)


def default_seed() -> int:
    """The seed xdevice draws with when none is given: the last ``seed(n)``, else 0.

    >>> isinstance(default_seed(), int)
    True
    """
    return 0 if _seed is None else _seed


def seed_backend(target: Backend) -> None:
    """Seed ``target``'s framework with the seed set, unless it already has it (or none is set)."""
    with _lock:
        if _seed is None or _seeded.get(target.name) == _seed:
            return
        target.seed(_seed)
        _seeded[target.name] = _seed


def waits_for(name: str) -> bool:
    """Whether backend ``name``'s framework is still to be seeded as it loads."""
    return _seed is not None and _seeded.get(name) != _seed
