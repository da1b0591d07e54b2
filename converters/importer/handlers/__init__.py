"""ONNX op handlers, one module per family; ``registry.HANDLER_MODULES`` lists them."""
