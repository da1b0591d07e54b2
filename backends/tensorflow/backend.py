"""``TensorflowBackend``: the mixins of this folder assembled into one backend."""

from xdevice.backends.base import Backend
from xdevice.backends.tensorflow import TITLE
from xdevice.backends.tensorflow.autodiff import Autodiff
from xdevice.backends.tensorflow.devices import Devices
from xdevice.backends.tensorflow.export import Export
from xdevice.backends.tensorflow.memory import Memory
from xdevice.backends.tensorflow.native import Native
from xdevice.backends.tensorflow.numerics import Numerics
from xdevice.backends.tensorflow.ops import TensorflowOps
from xdevice.backends.tensorflow.placement import Placement
from xdevice.backends.tensorflow.replication import Replication

__all__ = ["TensorflowBackend"]


class TensorflowBackend(Devices, Memory, Numerics, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "tensorflow"
    title = TITLE
    accepts = {
        "array": "tf.Tensor or tf.Variable",
        "model": "a Keras model, tf.Module or tf.function",
        "device": "tf.config.LogicalDevice",
    }
    saved_format = ".savedmodel"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    supports_replication = True
    supports_processes = True
    dlpack_alignment = 64  # Eigen's EIGEN_MAX_ALIGN_BYTES: tensor.h's IsAligned() check aborts below it
    dlpack_strided = False  # TensorFlow refuses DLPack strides that are not compact row-major
    ops = TensorflowOps()
