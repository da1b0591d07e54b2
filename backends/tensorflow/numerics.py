"""TensorFlow numerics: TF32 execution, op determinism, its global (and Keras') seed.

TensorFlow has one switch, ``enable_tensor_float_32_execution``, on by default: "highest"
turns it off; "high" and "medium" turn it on (TensorFlow has no bfloat16 mode for float32
products, so "medium" runs as TF32, and the report says so).

``deterministic=True``: ``tf.config.experimental.enable_op_determinism()`` (an op without a
deterministic kernel then raises, and random ops need a seed: the global one is set from
xdevice's seed) and one intra-op thread (Eigen's contractions split their sums by thread
count), which TensorFlow accepts only before its runtime starts (core has refused a started one).
"""

from __future__ import annotations

import sys

import tensorflow as tf

from xdevice._errors import ConfigurationError, message
from xdevice._seed import default_seed
from xdevice._types import Applied, Config


class Numerics:
    def configure_numerics(self, config: Config) -> list[Applied]:
        precision = config.matmul_precision or "highest"
        tf.config.experimental.enable_tensor_float_32_execution(precision != "highest")
        detail = {
            "highest": "enable_tensor_float_32_execution(False): IEEE float32",
            "high": "enable_tensor_float_32_execution(True): TF32",
            "medium": "enable_tensor_float_32_execution(True): TF32 (TensorFlow has no bfloat16 mode for float32)",
        }[precision]
        rows = [Applied("tensorflow", "matmul_precision", precision, "applied", detail)]
        if not config.deterministic:
            return rows + [Applied("tensorflow", "deterministic", False, "applied", "TensorFlow's defaults")]
        try:
            tf.config.threading.set_intra_op_parallelism_threads(1)
        except RuntimeError as error:  # started: core checks first, so only if TF's own test differs
            raise ConfigurationError(
                message(
                    "TensorFlow already started, so deterministic=True cannot pin its intra-op threads",
                    received=str(error),
                    fix="call xdevice.configure(deterministic=True) before the first TensorFlow computation",
                )
            ) from error
        tf.config.experimental.enable_op_determinism()
        if not _seeded():
            tf.random.set_seed(default_seed())  # determinism refuses random ops without a seed
        return rows + [
            Applied(
                "tensorflow",
                "deterministic",
                True,
                "applied",
                "enable_op_determinism(), set_intra_op_parallelism_threads(1)",
            )
        ]

    def numerics(self) -> dict[str, object]:
        from tensorflow.python.framework import config as framework_config  # no public getter

        return {
            "matmul_precision": "tf32" if tf.config.experimental.tensor_float_32_execution_enabled() else "ieee",
            "tensor_float_32_execution": tf.config.experimental.tensor_float_32_execution_enabled(),
            "deterministic": bool(framework_config.is_op_determinism_enabled()),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        }

    def seed(self, n: int) -> None:
        tf.random.set_seed(n)
        if "keras" in sys.modules:  # Keras 3 keeps its own global seed beside TensorFlow's
            import keras

            keras.utils.set_random_seed(n)


def _seeded() -> bool:
    from tensorflow.python.eager import context  # private: the global seed has no public getter

    return context.global_seed() is not None
