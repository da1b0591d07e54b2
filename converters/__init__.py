"""ONNX converters (``xdevice.converters``): export from and import into every backend.

Not implemented yet: this package is a placeholder for issue 4.
"""
