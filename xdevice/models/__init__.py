"""The reference zoo: five models, one set of weights, the same answers on every backend.

Each model is data plus a function: a spec (hyper-parameters), a flat dict of named
parameters, and a pure ``apply(ops, params, x, spec, train=False)`` written once against
the op set (``xdevice.backends.opset``). With ``train=True`` every model returns
``(outputs, updated buffers)``: batch norm's running statistics come back as new values
instead of being changed in place, so ``apply`` stays pure under ``jax.jit``. Weights are drawn from a seed with numpy, so they
are the same on every backend, and saved as safetensors.

Layouts, the same everywhere (and what ``to_native`` translates for each framework):

| layer | parameter | layout |
|---|---|---|
| dense | ``weight``, ``bias`` | ``(in, out)``, ``(out,)``: ``y = x @ weight + bias`` (PyTorch's ``Linear`` stores the transpose) |
| conv | ``weight``, ``bias`` | ``(out, in, kh, kw)`` (OIHW, PyTorch's); inputs NCHW (TensorFlow's kernels run NHWC inside the backend) |
| batch norm | ``scale``, ``offset``; buffers ``mean``, ``var`` | ``(C,)``; running variance unbiased, momentum 0.1 (PyTorch's rule) |
| layer norm | ``scale``, ``offset`` | the normalised (trailing) shape |
| LSTM | ``w_ih``, ``w_hh``, ``b`` | ``(in, 4H)``, ``(H, 4H)``, ``(4H,)``; gates ``i, f, g, o`` (PyTorch's and Keras' order); one bias, PyTorch's ``b_ih + b_hh`` |
| embedding | ``weight`` | ``(vocab, width)`` |
| attention | ``qkv.weight`` | ``(width, 3 * width)``: q, k, v side by side; heads split the width |

>>> from xdevice import models
>>> model = models.build("cnn", backend="numpy", seed=0)
>>> model(model.example_input(2)).shape
(2, 10)
"""

from xdevice.models._model import NAMES, PRETRAINED, Model, build, definition, describe, load
from xdevice.models._native import from_native, to_native

__all__ = ["NAMES", "PRETRAINED", "Model", "build", "definition", "describe", "from_native", "load", "to_native"]
