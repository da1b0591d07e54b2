"""A model's inputs and outputs as flat, named arrays, and back (``Inputs``, ``flat_outputs``).

Every backend's export and autodiff, and core's export driver, flatten and rebuild the
same nested structures (arrays in tuples, lists and dicts) the same way through here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["map_leaves", "Inputs", "call_with", "flat_outputs", "output_names"]


def map_leaves(fn: Any, tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with ``fn`` applied to every other value in it."""
    if isinstance(tree, dict):
        return {key: map_leaves(fn, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(fn, value) for value in tree)
    return fn(tree)


class Inputs(tuple):
    """Example inputs as a model takes them, flat: a tuple of the arrays (in order), which
    also knows their ``names`` and how to ``rebuild`` the structure they came in.

    Positional inputs (one array, or a tuple or list of them) are named ``input`` /
    ``input_<i>``; named inputs (a dict, as Hugging Face models take keyword arguments and
    Keras and JAX models one dict) are named by their key, nested values by their path
    (``"image.0"``). Each framework decides what a dict means: PyTorch passes it as keyword
    arguments, Keras and JAX as one argument.

    >>> inputs = Inputs.of({"ids": 1, "mask": 2})
    >>> tuple(inputs), inputs.names, inputs.rebuild([3, 4])
    ((1, 2), ('ids', 'mask'), {'ids': 3, 'mask': 4})
    """

    names: tuple[str, ...]
    structure: Any  # the given structure with each leaf replaced by its position

    @classmethod
    def of(cls, given: Any, convert: Any = None) -> Inputs:
        """``given`` flattened; ``convert`` (e.g. to numpy) is applied to each leaf."""
        leaves: list = []
        names: list[str] = []

        def walk(value: Any, path: str) -> Any:
            if isinstance(value, dict):
                return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value))
            leaves.append(convert(value) if convert else value)
            names.append(path)
            return len(leaves) - 1

        if isinstance(given, dict):
            structure = walk(given, "")
        else:
            items = tuple(given) if isinstance(given, (tuple, list)) else (given,)
            structure = tuple(walk(v, "input" if len(items) == 1 else f"input_{i}") for i, v in enumerate(items))
        made = cls(leaves)
        made.names, made.structure = tuple(names), structure
        return made

    @property
    def named(self) -> bool:
        """Whether the inputs came as a dict (keyword or dict inputs)."""
        return isinstance(self.structure, dict)

    def rebuild(self, leaves: Any) -> Any:
        """The structure the inputs came in, holding ``leaves`` (same order) instead."""
        leaves = list(leaves)
        return map_leaves(lambda position: leaves[position], self.structure)

    def replaced(self, leaves: Any) -> Inputs:
        """The same names and structure over other arrays (another batch, say)."""
        made = type(self)(leaves)
        made.names, made.structure = self.names, self.structure
        return made


def call_with(fn: Any, inputs: Inputs, leaves: Any, *, keywords: bool) -> Any:
    """``fn`` called on ``leaves`` in the structure ``inputs`` came in: positionally, or for
    named inputs as keyword arguments (``keywords``, PyTorch's way) or one dict argument."""
    structure = inputs.rebuild(leaves)
    if not inputs.named:
        return fn(*structure)
    return fn(**structure) if keywords else fn(structure)


def flat_outputs(y: Any) -> list[Any]:
    """A model's outputs as one flat list, in the order the ONNX graph lists them: an array,
    or tuples, lists and dicts of them (a dict in sorted key order, as ``tf.nest`` and JAX
    trees flatten it; ``torch.export`` would keep insertion order)."""
    if isinstance(y, dict):
        return [leaf for key in sorted(y) for leaf in flat_outputs(y[key])]
    if isinstance(y, (tuple, list)):
        return [leaf for item in y for leaf in flat_outputs(item)]
    return [y]


def output_names(y: Any) -> list[str]:
    """A name for each of ``flat_outputs(y)``: ``output`` / ``output_<i>`` for positional
    outputs, the key path for a dict's (``"logits"``, ``"hidden.0"``)."""
    named: list[tuple[str, bool]] = []

    def walk(value: Any, path: str, keyed: bool) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                walk(value[key], f"{path}.{key}" if path else str(key), True)
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, f"{path}.{i}" if path else str(i), keyed)
        else:
            named.append((path, keyed))

    walk(y, "", False)
    if not any(keyed for _, keyed in named):
        return ["output" if len(named) == 1 else f"output_{i}" for i in range(len(named))]
    return [path for path, _ in named]
