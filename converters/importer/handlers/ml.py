"""The ``ai.onnx.ml`` domain's ops that ONNX's node suite tests (LabelEncoder, TreeEnsemble,
Binarizer, ArrayFeatureExtractor), and TfIdfVectorizer."""

from __future__ import annotations
