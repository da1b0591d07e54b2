"""ONNX converters: export and import."""
