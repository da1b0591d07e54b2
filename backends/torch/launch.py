"""What ``torch.distributed`` needs to join the processes ``xdevice launch`` started.

``init_method="env://"`` (``replication.py``) reads ``MASTER_ADDR``/``MASTER_PORT``, the store
where the group meets, and ``RANK``/``WORLD_SIZE``; ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
say which of this node's processes this one is, as torchrun says it. Under torchrun's agent
they are the values it set already. Imports no framework: the launcher's workers call
:func:`environment` for every installed backend (``xdevice._processes.environment``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xdevice._processes import Rendezvous

__all__ = ["environment"]


def environment(rendezvous: Rendezvous) -> dict[str, str]:
    """The ``env://`` variables of ``rendezvous``'s process group."""
    return {
        "MASTER_ADDR": rendezvous.address,
        "MASTER_PORT": str(rendezvous.port),
        "RANK": str(rendezvous.rank),
        "WORLD_SIZE": str(rendezvous.size),
        "LOCAL_RANK": str(rendezvous.local_rank),
        "LOCAL_WORLD_SIZE": str(rendezvous.local_size),
    }
