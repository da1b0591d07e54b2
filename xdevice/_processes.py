"""This process among the processes ``xdevice launch`` (or torchrun) started: who it is, what
each framework needs to join the others, and joining their group.

``xdevice launch`` describes the run in environment variables: ``RANK`` and ``WORLD_SIZE``
for everyone, from the launcher, and what each framework's engine needs to meet the other
processes, from that backend's own launch hook (``backends/<name>/launch.py``), which the
launcher's worker calls through :func:`environment` with a :class:`Rendezvous`. The launcher
knows none of the frameworks' variables; each backend writes its own and reads them back
when it joins its framework's group (``Backend.join_processes``).

Joining is an explicit step, never a side effect of loading a backend: the trainer and
``replicate`` join before training, and a script that computes with JAX or TensorFlow before
that (building a model, say) calls :func:`join_processes` first, since both must join before
their first computation. Imports no framework.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable

from xdevice import _registry

__all__ = ["Rendezvous", "environment", "world", "launched", "join_processes"]


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` unless started by ``xdevice launch``
    (or torchrun, which sets the same variables).

    >>> world() if "WORLD_SIZE" not in os.environ else (0, 1)
    (0, 1)
    """
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def launched() -> bool:
    """Whether this process is one of several that ``xdevice launch`` started."""
    return world()[1] > 1


def join_processes(backend: str) -> tuple[int, int]:
    """Join ``backend``'s process group when ``xdevice launch`` started this process (a no-op
    otherwise, and when already joined); returns ``(rank, world size)``.

    Call it at the top of a launched script that computes with JAX or TensorFlow before it
    trains (both must join before their first computation); ``fit`` and ``replicate`` call it
    themselves.

    >>> join_processes("numpy") if not launched() else (0, 1)
    (0, 1)
    """
    if launched():
        _registry.backend(backend).join_processes()
    return world()


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """What a launcher's worker tells each backend's launch hook about the processes it
    started: who this process is, where the group meets, and a key-value store every process
    of the group shares, to publish what no flag gives (an address, a free port).

    Attributes:
        rank, size: this process's number and the number of processes, on every node.
        local_rank, local_size: the same on this node.
        address, port: where the group meets (on rank 0's node): the launcher's key-value
            store, which ``torch.distributed`` joins too.
        host: this machine's address on the route to ``address``: what the other nodes reach.
        publish: ``publish(key, value)`` sets ``key`` for every process of this attempt (keys
            begin with the backend's name: ``"jax/coordinator"``).
        lookup: ``lookup(key)`` is the value some process published, waiting until it has.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    address: str
    port: int
    host: str
    publish: Callable[[str, str], None]
    lookup: Callable[[str], str]

    def free_address(self) -> str:
        """``host:port`` of a port free on this machine, that the other nodes can reach."""
        with socket.socket() as probe:
            probe.bind((self.host, 0))
            return f"{self.host}:{probe.getsockname()[1]}"


def environment(rendezvous: Rendezvous) -> dict[str, str]:
    """The environment every installed backend's engine needs for the processes of
    ``rendezvous``: each backend package's launch hook (``launch.environment``, which imports no
    framework) adds its own variables, in registry order, so every process publishes and looks
    up the same keys in the same order. A backend without a ``launch`` module needs nothing.
    """
    env: dict[str, str] = {}
    for name in _registry.backends():
        hook = _registry.extension(name, "launch")
        if hook is not None:
            env.update(hook.environment(rendezvous))
    return env
