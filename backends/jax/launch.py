"""What ``jax.distributed`` needs to join the processes ``xdevice launch`` started.

``jax.distributed.initialize`` takes a coordinator's ``host:port``, the process count and
this process's number (``replication.py`` reads them). No flag gives the coordinator: rank 0
publishes a free port on its machine through the launcher's rendezvous and every process
reads it back. Inside a cluster job (a ``JAXJob``, Trainer's JAX runtime, Slurm) the same:
the rank and count are the scheduler's (``xdevice.training.cluster``), the coordinator a port on
the pod of process 0. Imports no framework: the launcher's workers call :func:`environment` for
every installed backend (``xdevice._processes.environment``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xdevice._processes import Rendezvous

__all__ = ["COORDINATOR", "environment"]

#: ``host:port`` of the ``jax.distributed`` coordinator (rank 0's), for every process.
COORDINATOR = "XDEVICE_COORDINATOR"


def environment(rendezvous: Rendezvous) -> dict[str, str]:
    """:data:`COORDINATOR` for ``rendezvous``'s processes, the same address in each."""
    if rendezvous.rank == 0:
        rendezvous.publish("jax/coordinator", rendezvous.free_address())
    return {COORDINATOR: rendezvous.lookup("jax/coordinator")}
