"""The five real-architecture zoo models at their real (default) configurations on torch, with
seeded random weights: a forward at batch 1 has the right shape and is finite, and GPT-2 and
BERT give transformers' own outputs for the same weights (``save_pretrained`` then
``from_pretrained``). Llama's default is Llama 3.2 1B: about 5 GB of float32."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.reference import relative
from xdevice import models

pytestmark = pytest.mark.realworld

torch = pytest.importorskip("torch")

TOKENS = 16  # a short sequence: the real widths and depths are what is checked, not the length
#: the output's shape at batch 1 beyond the batch (images at the default 224)
SHAPES = {
    "resnet50": (1000,),
    "vit": (1000,),
    "bert": (TOKENS, 768),
    "gpt2": (TOKENS, 50257),
    "llama": (TOKENS, 128256),
}


def example(model: models.Model) -> np.ndarray:
    x = model.example_input(batch=1, seed=0)
    return np.ascontiguousarray(x[:, :TOKENS]) if x.ndim == 2 else x


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_default_configuration_runs_a_finite_forward_of_the_right_shape_on_torch(name):
    model = models.build(name, backend="torch", seed=0)
    with torch.no_grad():
        y = model.ops.to_numpy(model(example(model)))
    assert y.shape == (1, *SHAPES[name])
    assert np.isfinite(y).all()


@pytest.mark.parametrize("name, transformers_class", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel")])
def test_the_default_configuration_gives_transformers_outputs_for_the_same_weights(tmp_path, name, transformers_class):
    transformers = pytest.importorskip("transformers")
    model = models.build(name, backend="torch", seed=0)
    model.save_pretrained(tmp_path)
    reference = getattr(transformers, transformers_class).from_pretrained(tmp_path).eval()
    x = example(model)
    with torch.no_grad():
        y = model.ops.to_numpy(model(x))
        out = reference(torch.as_tensor(x, dtype=torch.long))
    expected = (out.logits if name == "gpt2" else out.last_hidden_state).numpy()
    assert relative(y, expected) <= 1e-4
