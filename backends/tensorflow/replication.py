"""TensorFlow data parallelism: ``tf.distribute.MirroredStrategy`` over the devices, or
``MultiWorkerMirroredStrategy`` over the workers ``xdevice launch`` started (``TF_CONFIG``).

The step runs once per replica under ``strategy.run`` on that replica's slice of the batch;
each replica's loss is weighted by its share of the global rows, and the gradients are
summed across replicas with the replica context's ``all_reduce`` (the strategy's own
collective), so every replica applies the same update to the same params. Across workers
the params start as worker 0's (DDP's rule; a Keras model's initial weights are drawn per
worker).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice.backends import training


class Replicas(training.Replicas):
    def __init__(self, backend: Any, strategy: tf.distribute.Strategy):
        super().__init__(backend)
        self.strategy = strategy
        self.count = strategy.num_replicas_in_sync
        resolver = strategy.cluster_resolver
        self.rank = resolver.task_id if resolver is not None and resolver.task_type else 0

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        if arrays and self.strategy.extended._in_multi_worker_mode():
            # every worker starts from worker 0's values (a Keras model's initial weights are
            # drawn per worker unless seeded), as DDP broadcasts rank 0's: a sum in which the
            # other workers contribute zeros
            first = self.rank == 0
            mine = {k: tf.convert_to_tensor(v) if first else tf.zeros_like(v) for k, v in arrays.items()}
            summed = {
                k: self.strategy.experimental_local_results(v)[0] for k, v in self._sum_over_workers(mine).items()
            }
            for key, value in arrays.items():
                if isinstance(value, tf.Variable):  # a Keras model's own variables stay its params
                    value.assign(summed[key])
                    summed[key] = value
            return summed
        return arrays  # plain tensors: strategy.run hands them to every replica

    @tf.function
    def _sum_over_workers(self, values: dict[str, Any]) -> dict[str, Any]:
        # One tensor at a time: a batched all-reduce packs mixed dtypes into one tensor and
        # fails. tf.identity: an all-reduce of the inputs themselves has no device to reduce to.
        def total(v):
            context = tf.distribute.get_replica_context()
            return {k: context.all_reduce("sum", tf.identity(x)) for k, x in v.items()}

        return self.strategy.run(total, args=(values,))

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        # every worker holds the global batch; replica ids count across workers
        xs, ys = tf.split(x, _sizes(int(x.shape[0]), self.count)), tf.split(y, _sizes(int(y.shape[0]), self.count))
        values = self.strategy.experimental_distribute_values_from_function
        return (
            values(lambda context: xs[context.replica_id_in_sync_group]),
            values(lambda context: ys[context.replica_id_in_sync_group]),
        )

    def weight(self, x: Any) -> Any:
        rows = tf.cast(tf.shape(x)[0], tf.float32)
        return rows / tf.distribute.get_replica_context().all_reduce("sum", rows)

    def sum(self, tree: Any) -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", tree)

    def compile(self, step):
        strategy = self.strategy

        @tf.function
        def run(*args):
            results = strategy.run(step, args=args)
            return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)

        return run

    def sharded(self) -> training.Replicas:
        # Refused, never replicated in its place: Keras 3's distribution API (ModelParallel,
        # LayoutMap) shards variables on the JAX backend only (its TensorFlow part is a prototype
        # marked "DO NOT USE", without distribute_variable, in Keras 3.15 with TF 2.21), and
        # tf.experimental.dtensor does not run under tf.distribute strategies, which this trainer
        # steps with.
        raise ConfigurationError(
            message(
                "TensorFlow cannot shard parameters across devices (strategy='fsdp'): Keras' distribution "
                "API shards on the JAX backend only, and DTensor does not run under tf.distribute",
                received=f"strategy='fsdp' over {self.count} replicas",
                fix="train with strategy='replicate' (MirroredStrategy), or move the model to JAX "
                "(model.to('jax') for a zoo model), which shards over devices=[...]",
            )
        )


def _sizes(rows: int, count: int) -> list[int]:
    """Rows per replica: as even as possible, the first ones one larger."""
    base, extra = divmod(rows, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


class Replication:
    native_device: Callable[[Device], str]  # devices.py's, in the assembled backend

    def replicas(self, devices: list[Device]) -> Replicas:
        names = [self.native_device(d) for d in devices]
        # On CPUs, TF's collective all-reduce fails with an InternalError once a second
        # strategy is made in the process; reducing on one device works and CPUs lose
        # nothing by it. GPUs keep the default (NCCL).
        on_cpu = all(d.upper().startswith("/CPU") for d in names)
        reduce = tf.distribute.ReductionToOneDevice() if on_cpu else None
        return Replicas(self, tf.distribute.MirroredStrategy(names, cross_device_ops=reduce))

    def join_processes(self) -> None:
        global _workers
        if _workers is not None:
            return
        if "TF_CONFIG" not in os.environ:
            raise ConfigurationError(
                message(
                    "TensorFlow needs TF_CONFIG to join the other workers",
                    received="TF_CONFIG unset",
                    fix="xdevice launch sets it for one node; with several nodes write each worker's TF_CONFIG",
                )
            )
        kinds = tf.distribute.experimental.CommunicationImplementation  # RING: gRPC, for CPUs
        gpus = bool(tf.config.list_physical_devices("GPU"))
        options = tf.distribute.experimental.CommunicationOptions(implementation=kinds.NCCL if gpus else kinds.RING)
        try:
            _workers = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except (RuntimeError, ValueError) as error:
            raise ConfigurationError(
                message(
                    "TensorFlow could not join the launched workers",
                    received=str(error).splitlines()[0],
                    fix="call xdevice.join_processes('tensorflow') at the top of the script, before anything "
                    "computes with TensorFlow (building a model does)",
                )
            ) from error
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # TF's own handler swallows SIGTERM

    def process_replicas(self) -> Replicas:
        self.join_processes()
        return Replicas(self, _workers)


#: the process's one MultiWorkerMirroredStrategy (TF allows one), made when it joins
_workers: tf.distribute.Strategy | None = None
