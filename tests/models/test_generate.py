"""Greedy generation with a key/value cache: token for token transformers' ``generate(do_sample=False)``
on every backend, padded or not, ending rows at their end-of-sequence id; one compiled step."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models import test_gpt2, test_llama
from xdevice import ConfigurationError, models
from xdevice.models import _generate

BUILDERS = {"gpt2": test_gpt2.transformers_model, "llama": test_llama.transformers_model}
IDS = np.random.default_rng(2).integers(0, 96, size=(3, 10))
MASK = test_gpt2.MASK  # rows 1 and 2 padded on the left
NEW = 8


def transformers_generate(model, ids, mask=None, **options):
    import torch

    given = {} if mask is None else {"attention_mask": torch.as_tensor(mask)}
    with torch.no_grad():
        out = model.generate(torch.as_tensor(ids), max_new_tokens=NEW, do_sample=False, **given, **options)
    return out.numpy()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``{name: (folder, transformers model)}`` for both decoders."""
    out = {}
    for name, build in BUILDERS.items():
        model = build(seed=4)
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = folder, model
    return out


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", list(BUILDERS))
def test_greedy_tokens_are_transformers_tokens(backend, saved, name, padded):
    folder, reference = saved[name]
    mask = MASK if padded else None
    expected = transformers_generate(reference, IDS, mask)
    assert len({tuple(row) for row in expected[:, IDS.shape[1] :]}) == 3  # the rows differ: a real check
    model = models.build(name, backend=backend.name, weights=folder)
    got = model.generate(IDS, max_new_tokens=NEW, attention_mask=mask)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


def test_a_row_that_ends_is_padded_and_generation_stops_when_all_have_ended(backend, tmp_path, saved):
    _, free = saved["llama"]
    tokens = transformers_generate(free, IDS)[:, IDS.shape[1] :]
    end = int(tokens[0, 2])  # row 0 ends at its third new token
    reference = test_llama.transformers_model(seed=4, eos_token_id=end, pad_token_id=95)
    expected = transformers_generate(reference, IDS, pad_token_id=95)
    reference.save_pretrained(tmp_path)
    model = models.build("llama", backend=backend.name, weights=tmp_path)
    assert model.spec["eos"] == end and model.spec["pad"] == 95
    got = model.generate(IDS, max_new_tokens=NEW)
    np.testing.assert_array_equal(got, expected)
    assert (got[0, IDS.shape[1] + 3 :] == 95).all()


def test_one_row_of_ids_and_lists_are_taken():
    model = models.build("gpt2", **test_gpt2.gpt2.SMALL)
    both = model.generate([IDS[0].tolist()], max_new_tokens=3)
    np.testing.assert_array_equal(model.generate(IDS[0], max_new_tokens=3), both)
    assert both.shape == (1, IDS.shape[1] + 3)


@pytest.mark.parametrize("name", ["jax", "tensorflow"])
def test_the_decoding_step_compiles_once(name):
    pytest.importorskip(name)
    model = models.build("llama", backend=name, **test_llama.llama.SMALL)
    step = _generate.compiled(model)
    before = step.traces
    model.generate(IDS, max_new_tokens=NEW)
    assert step.traces - before == 2  # the prompt's shape and the one-token steps', once each
    model.generate(IDS[::-1].copy(), max_new_tokens=NEW, attention_mask=MASK)  # other ids, same shapes
    assert step.traces - before == 2
    if name == "jax":
        assert step.run._cache_size() == 2


def test_a_model_that_does_not_generate_says_so():
    with pytest.raises(ConfigurationError, match="does not generate text"):
        models.build("mlp").generate(np.zeros((1, 4), np.int64))


def test_more_tokens_than_gpt2_has_positions_are_refused():
    model = models.build("gpt2", **test_gpt2.gpt2.SMALL)  # 32 positions
    with pytest.raises(ConfigurationError, match="max_new_tokens=22"):
        model.generate(IDS, max_new_tokens=23)


def test_a_mask_of_another_shape_is_refused():
    model = models.build("gpt2", **test_gpt2.gpt2.SMALL)
    with pytest.raises(ConfigurationError, match="attention_mask has the shape of ids"):
        model.generate(IDS, max_new_tokens=2, attention_mask=MASK[:, :5])
