"""Greedy generation with a key/value cache for the zoo's decoders (``gpt2``, ``llama``), on every backend.

Token for token what transformers' ``generate(do_sample=False)`` gives: the prompt's
positions come from its attention mask (``cumsum(mask) - 1``, 0 on padding, as
``GenerationMixin`` makes them), each row takes the argmax of its last logits, a row that
produced an end-of-sequence id gets the pad id from then on, and generation stops when every
row has finished or ``max_new_tokens`` were made. Without an attention mask, a pad id of the
config's own (not an end-of-sequence id) marks padding where the prompt holds it, as
transformers infers the mask.

How the work is split. This module owns everything the decoders share: the causal mask
(with padding), the cache, where each step writes into it, the grouping of query heads over
key/value heads, and the loop. A decoder's ``apply`` builds a :class:`Decoder` from its
inputs and calls :meth:`Decoder.attend` with each layer's queries, keys and values; it
supplies only what differs (its embeddings, how positions enter — learned rows for GPT-2,
rotations for Llama — and its blocks) plus ``cache_layout(spec)``: ``(layers, key/value
heads, head size)``.

The cache has a static shape. ``generate`` allocates it once at its full length (prompt plus
``max_new_tokens``) and a step writes its keys and values at a position that is an array, not
a Python number (``ops.write_slots``: ``index_copy``, ``dynamic_update_slice``), so under ``jax.jit`` and
``tf.function`` one function, compiled once for the prompt's shape and once for the one-token
steps, serves the whole generation: a step never recompiles (``compiled(model).traces``
counts the traces). Slots not written yet are never attended: causality hides every slot
past the query's own.

Token ids come back as a numpy ``int64`` array ``(rows, prompt + new)``, whatever the backend:
they go to a tokenizer next, and each backend's array is one ``ops.asarray`` away.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message

__all__ = ["Decoder", "generate", "compiled"]


class Decoder:
    """One decoder forward pass: its positions, its causal mask, and its cache when it has one.

    Args:
        ops: the backend's op set.
        x: token ids ``(rows, tokens)``.
        attention_mask: ``(rows, tokens)``, 1 for real tokens, 0 for padding (without a cache).
        cache: ``{"keys": (per layer), "values": (per layer), "index": int32 scalar array,
            "mask": (rows, length) bool}`` (see :func:`new_cache`): ``x`` goes into slots
            ``index, index + 1, ...`` and attends over every slot up to its own that ``mask`` keeps.
        positions: ``(rows, tokens)`` position ids; default ``0 .. tokens - 1`` (transformers'
            forward without ``position_ids``, padding or not).
    """

    def __init__(self, ops: Any, x: Any, attention_mask: Any = None, cache: Any = None, positions: Any = None):
        if cache is not None and attention_mask is not None:
            raise ConfigurationError(
                message(
                    "With a cache, the attention mask is the cache's",
                    received="attention_mask= and cache=",
                    fix="put the padding in cache['mask'] (rows, cache length)",
                )
            )
        self.ops, self.cache = ops, cache
        self.tokens = tokens = ops.shape(x)[1]
        self.positions = positions  # None: 0 .. tokens - 1
        self.updated: dict[str, list] = {"keys": [], "values": []}
        if cache is None:
            rows = ops.arange(tokens)
            # expand_dims, not reshape: the token count may be a symbolic axis while exporting
            causal = ops.less_equal(ops.expand_dims(rows, 0), ops.expand_dims(rows, 1))
            allowed = ops.expand_dims(ops.expand_dims(causal, 0), 0)  # (1, 1, tokens, tokens)
            if attention_mask is not None:
                keep = ops.not_equal(attention_mask, 0)
                allowed = ops.logical_and(allowed, ops.expand_dims(ops.expand_dims(keep, 1), 1))
        else:
            length = ops.shape(cache["mask"])[1]
            slots = ops.arange(length)
            queries = ops.add(ops.arange(tokens), ops.cast(cache["index"], "int32"))
            causal = ops.less_equal(ops.expand_dims(slots, 0), ops.expand_dims(queries, 1))  # (tokens, length)
            allowed = ops.logical_and(
                ops.reshape(causal, (1, 1, tokens, length)), ops.reshape(cache["mask"], (-1, 1, 1, length))
            )
        self.mask = allowed  # (rows or 1, 1, tokens, keys)

    def position_ids(self) -> Any:
        """``(rows or 1, tokens)`` int32 positions."""
        if self.positions is None:
            return self.ops.expand_dims(self.ops.arange(self.tokens), 0)
        return self.ops.cast(self.positions, "int32")

    def attend(self, layer: int, q: Any, k: Any, v: Any, scale: float | None = None) -> Any:
        """Causal attention of ``q`` ``(rows, heads, tokens, d)`` over ``k``, ``v`` ``(rows,
        kv heads, tokens, d)``, through the cache when there is one (this pass's keys and values
        are written into it first). Query heads are grouped over key/value heads as
        transformers' ``repeat_kv`` pairs them (head ``h`` reads key/value head ``h // group``),
        without copying the keys: a group's queries are stacked as extra rows."""
        ops = self.ops
        if self.cache is not None:
            k = self._write(self.cache["keys"][layer], k)
            v = self._write(self.cache["values"][layer], v)
            self.updated["keys"].append(k)
            self.updated["values"].append(v)
        heads, kv_heads = ops.shape(q)[1], ops.shape(k)[1]
        group, tokens, size = heads // kv_heads, ops.shape(q)[2], ops.shape(q)[3]
        if group == 1:
            return ops.attention(q, k, v, self.mask, scale)
        stacked = ops.reshape(q, (-1, kv_heads, group * tokens, size))
        mask = ops.tile(self.mask, (1, 1, group, 1))
        return ops.reshape(ops.attention(stacked, k, v, mask, scale), (-1, heads, tokens, size))

    def last(self, h: Any) -> Any:
        """``h`` ``(rows, tokens, width)``, cut to the last token when generating (only its
        logits are read: transformers' ``logits_to_keep=1``)."""
        if self.cache is None:
            return h
        return self.ops.slice(h, [self.tokens - 1], [self.tokens], axes=[1])

    def result(self, logits: Any, train: bool) -> Any:
        """What ``apply`` returns: ``(logits, cache)`` with a cache, ``(logits, {})`` in training
        (no buffers), else the logits."""
        if self.cache is not None:
            return logits, {**self.cache, "keys": tuple(self.updated["keys"]), "values": tuple(self.updated["values"])}
        return (logits, {}) if train else logits

    def _write(self, cache: Any, new: Any) -> Any:
        """``cache`` ``(rows, heads, length, d)`` with ``new`` ``(rows, heads, tokens, d)`` in
        slots ``index .. index + tokens - 1`` (the index may be an array the compiled step takes
        as an argument)."""
        return self.ops.write_slots(cache, new, self.cache["index"], axis=2)


def new_cache(ops: Any, layout: tuple[int, int, int], rows: int, length: int, dtype: str) -> dict[str, Any]:
    """Zeros for ``layers`` keys and values ``(rows, kv heads, length, head size)``."""
    layers, heads, size = layout
    shape = (rows, heads, length, size)
    return {part: tuple(ops.zeros(shape, dtype) for _ in range(layers)) for part in ("keys", "values")}


class Step:
    """A decoder's forward over a cache, compiled the backend's way (``Backend.jit``): token ids
    and positions in, the greedy next id of every row and the updated cache out. ``traces``
    counts how many times the Python function ran to be traced (every call on the eager
    backends, numpy and torch)."""

    def __init__(self, backend: Any, module: Any, spec: dict[str, Any]):
        self.traces = 0
        ops = backend.ops

        def run(params: dict[str, Any], cache: dict[str, Any], ids: Any, positions: Any) -> tuple[Any, Any]:
            self.traces += 1  # a Python side effect: under jit it runs only while tracing
            params = {key: ops.stop_gradient(value) for key, value in params.items()}  # torch records no graph
            logits, cache = module.apply(ops, params, ids, spec, cache=cache, positions=positions)
            return ops.argmax(ops.squeeze(logits, 1), axis=-1), cache

        self.run = backend.jit(run)

    def __call__(self, *args: Any) -> tuple[Any, Any]:
        return self.run(*args)


_STEPS: dict[tuple[str, str, str], Step] = {}


def compiled(model: Any) -> Step:
    """The compiled step for ``model``'s backend, architecture and spec (made once, kept)."""
    from xdevice import _registry
    from xdevice.models._model import definition

    key = (model.backend, model.name, json.dumps(model.spec, sort_keys=True))
    if key not in _STEPS:
        _STEPS[key] = Step(_registry.backend(model.backend), definition(model.name), model.spec)
    return _STEPS[key]


def generate(model: Any, ids: Any, max_new_tokens: int = 20, attention_mask: Any = None) -> np.ndarray:
    """``ids`` ``(rows, tokens)`` followed by up to ``max_new_tokens`` greedy tokens, as transformers'
    ``generate(do_sample=False, max_new_tokens=...)`` gives them (see the module).

    Args:
        model: a zoo ``Model`` whose definition has ``cache_layout`` (``gpt2``, ``llama``).
        ids: token ids, numpy or the backend's array.
        max_new_tokens: how many tokens to add at most (fewer when every row ends with the
            spec's ``eos`` first).
        attention_mask: 1 for real tokens, 0 for padding (left padding, as for transformers'
            decoders); default all ones.

    Returns:
        numpy ``int64`` ``(rows, tokens + new)``.

    >>> from xdevice import models
    >>> model = models.build("gpt2", **models.definition("gpt2").SMALL)
    >>> model.generate([[1, 2, 3]], max_new_tokens=4).shape
    (1, 7)
    """
    from xdevice import _registry
    from xdevice.models._model import definition

    module = definition(model.name)
    if not hasattr(module, "cache_layout"):
        raise ConfigurationError(
            message(
                f"Zoo model {model.name!r} does not generate text",
                expected="a decoder: gpt2 or llama",
                received=model.name,
            )
        )
    ops, backend = model.ops, _registry.backend(model.backend)
    prompt = _host(ops, ids, "ids")
    if prompt.ndim == 1:
        prompt = prompt[None]
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ConfigurationError(
            message("generate takes token ids (rows, tokens)", received=f"shape {list(prompt.shape)}", fix="ids[None]")
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigurationError(
            message("max_new_tokens is a count of tokens", expected="an int >= 0", received=max_new_tokens)
        )
    model.check_input(prompt)
    tokens = prompt.shape[1]
    eos = model.spec.get("eos")
    stops = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    pad = model.spec.get("pad")
    pad = stops[0] if pad is None and stops else pad  # transformers' rule when no pad id is set
    if attention_mask is not None:
        mask = _host(ops, attention_mask, "attention_mask")
    elif pad is not None and pad not in stops:  # transformers infers the mask from a pad id of its own
        mask = (prompt != pad).astype(np.int64)
    else:
        mask = np.ones_like(prompt)
    if mask.shape != prompt.shape:
        raise ConfigurationError(
            message(
                "attention_mask has the shape of ids",
                expected=f"{list(prompt.shape)}",
                received=f"{list(mask.shape)}",
            )
        )
    if max_new_tokens == 0:
        return prompt.astype(np.int64)
    if module.fitting(model.spec, (tokens + max_new_tokens,)) is not None:  # GPT-2: a row per position
        raise ConfigurationError(
            message(
                f"The prompt and the new tokens make {tokens + max_new_tokens} positions, past the model's",
                expected=f"at most {model.spec['length']} positions",
                received=f"{tokens} tokens and max_new_tokens={max_new_tokens}",
                fix=f"max_new_tokens={max(model.spec['length'] - tokens, 0)}, or a shorter prompt",
            )
        )

    with backend.default_device(model.device):  # the cache is made where the weights are
        return _decode(model, module, backend, prompt, mask, max_new_tokens, stops, pad)


def _decode(
    model: Any, module: Any, backend: Any, prompt: np.ndarray, mask: np.ndarray, new: int, stops: list[int], pad: Any
) -> np.ndarray:
    """The loop: the prompt through the compiled step once, then one token a step."""
    ops, (rows, tokens) = model.ops, prompt.shape

    def put(value: Any) -> Any:
        return backend.to_device(ops.asarray(value), model.device)

    positions = np.where(mask == 0, 0, np.cumsum(mask, axis=1) - 1).astype(np.int32)  # GenerationMixin's
    layers = new_cache(ops, module.cache_layout(model.spec), rows, tokens + new, model._float_dtype())
    cache = {**{part: tuple(map(put, arrays)) for part, arrays in layers.items()}, "index": put(np.int32(0))}
    cache["mask"] = put(np.concatenate([mask != 0, np.ones((rows, new), bool)], axis=1))
    step = compiled(model)
    chosen, cache = step(model.params, cache, put(prompt.astype(np.int32)), put(positions))
    out, finished, last = [prompt.astype(np.int64)], np.zeros(rows, bool), positions[:, -1]
    for i in range(new):
        token = ops.to_numpy(chosen).astype(np.int64)
        if stops:  # transformers' rule: a finished row takes the pad id
            token = np.where(finished, pad, token)
            finished |= np.isin(token, stops)
        out.append(token[:, None])
        if i == new - 1 or (stops and finished.all()):
            break
        cache = {**cache, "index": put(np.int32(tokens + i))}
        chosen, cache = step(
            model.params, cache, put(token[:, None].astype(np.int32)), put((last + 1 + i)[:, None].astype(np.int32))
        )
    return np.concatenate(out, axis=1)


def _host(ops: Any, value: Any, name: str) -> np.ndarray:
    """``value`` (a list, numpy, or a backend's array) as a numpy integer array."""
    array = (
        value
        if isinstance(value, np.ndarray)
        else (ops.to_numpy(value) if hasattr(value, "shape") else np.asarray(value))
    )
    if array.dtype.kind == "b":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise ConfigurationError(
            message(
                f"{name} holds integers",
                received=f"{array.dtype.name}{list(array.shape)}",
                fix=f"{name}.astype('int64')",
            )
        )
    return array
