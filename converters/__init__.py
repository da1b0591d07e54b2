"""ONNX converters (``xdevice.converters``): export from and import into every backend.

- ``export`` (``converters/export.py``): a zoo model or a native one to a checked ONNX model,
  verified against its source in ONNX Runtime (``verify``, ``converters/verify.py``).
- ``from_onnx`` (``converters/importer/``): any ONNX model as a function of numpy, PyTorch,
  JAX or TensorFlow, interpreted over the op set, its weights trainable natively.
- ``convert_model`` (``converters/formats.py``): an ONNX model saved in a framework's own
  format (``.pt2``, SavedModel, serialized ``jax.export``).
- ``onnx_backend`` / ``conformance``: ONNX's own backend API and node test suite.

Importing this package imports no framework, nor onnx (numpy only).
"""

from xdevice.converters.checks import TensorInfo
from xdevice.converters.export import ExportResult, export
from xdevice.converters.formats import Converted, convert_model
from xdevice.converters.importer import ImportedModel, from_onnx
from xdevice.converters.verify import Verification, verify

__all__ = [
    "Converted",
    "ExportResult",
    "ImportedModel",
    "TensorInfo",
    "Verification",
    "convert_model",
    "export",
    "from_onnx",
    "verify",
]
