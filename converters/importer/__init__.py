"""ONNX import: any ONNX graph as a function on numpy, PyTorch, JAX or TensorFlow.

The graph is interpreted over the op set (``xdevice.backends.opset``): each ONNX op is
written once, as a handler (``registry``), for every backend. Float initializers become
the backend's own arrays in ``ImportedModel.params``; ``ImportedModel.apply(params, *inputs)``
is a pure function, so gradients come from the framework's own autodiff and ``jax.jit`` /
``tf.function`` compile it.
"""

from xdevice.converters.importer.model import ImportedModel, from_onnx

__all__ = ["ImportedModel", "from_onnx"]
