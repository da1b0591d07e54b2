"""What ``MultiWorkerMirroredStrategy`` needs to join the processes ``xdevice launch`` started.

TensorFlow reads ``TF_CONFIG``: every worker's ``host:port`` and this one's index among
them. No flag gives those addresses: each process publishes a free port on its machine
through the launcher's rendezvous, so the list names every worker on every node; inside a
``TFJob`` this replaces the operator's ``TF_CONFIG`` (its chief is worker 0), so a pod may run
several workers. Imports no framework: the launcher's workers call :func:`environment` for
every installed backend (``xdevice._processes.environment``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xdevice._processes import Rendezvous

__all__ = ["environment"]


def environment(rendezvous: Rendezvous) -> dict[str, str]:
    """``TF_CONFIG`` for ``rendezvous``'s processes: the cluster of every worker, this one's index."""
    rendezvous.publish(f"tensorflow/worker/{rendezvous.rank}", rendezvous.free_address())
    workers = [rendezvous.lookup(f"tensorflow/worker/{rank}") for rank in range(rendezvous.size)]
    cluster = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rendezvous.rank}}
    return {"TF_CONFIG": json.dumps(cluster)}
