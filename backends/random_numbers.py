"""Random numbers from explicit keys: a counter-based hash in 32-bit integer ops, the same on every backend."""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdevice.backends.primitives import Array, Primitives

__all__ = ["RandomNumbers"]


class RandomNumbers(Primitives):
    """Keys, uniform and normal draws, and dropout of the op set, written once over integer ops."""

    def random_key(self, seed: int) -> Array:
        """A key: two 32-bit words as an integer array of shape (2,)."""
        return self.asarray([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], dtype=self.key_dtype)

    def split_key(self, key: Array, count: int = 2) -> list[Array]:
        """``count`` new independent keys derived from ``key``."""
        bits = self.random_bits(key, (count, 2))
        return [self.take(bits, i, axis=0) for i in range(count)]

    #: the integer dtype that holds 32-bit words (uint32 where the backend has full support)
    key_dtype = "int64"

    def random_bits(self, key: Array, shape: Sequence[int]) -> Array:
        """Uniform 32-bit words (in ``key_dtype``) of ``shape``: a hash of (key, position)."""
        count = math.prod(shape)
        counter = self.arange(count, dtype=self.key_dtype)
        k0, k1 = self.take(key, 0), self.take(key, 1)
        x = self._hash(self.bitwise_xor(self._hash(self.bitwise_xor(counter, k0)), k1))
        return self.reshape(x, tuple(shape))

    def _hash(self, x: Array) -> Array:
        # "lowbias32" (Chris Wellons): xorshift-multiply rounds; masked to 32 bits so that
        # int64 backends compute exactly what uint32 ones do.
        mask = 0xFFFFFFFF
        x = self.bitwise_xor(x, self.right_shift(x, 16))
        x = self.bitwise_and(self.multiply(x, 0x7FEB352D), mask)
        x = self.bitwise_xor(x, self.right_shift(x, 15))
        x = self.bitwise_and(self.multiply(x, 0x846CA68B), mask)
        return self.bitwise_xor(x, self.right_shift(x, 16))

    def uniform(
        self, key: Array, shape: Sequence[int], low: float = 0.0, high: float = 1.0, dtype: str = "float32"
    ) -> Array:
        """Uniform floats in ``[low, high)``, 24 random bits each."""
        bits = self.right_shift(self.random_bits(key, shape), 8)
        unit = self.multiply(self.cast(bits, "float32"), 2.0**-24)
        return self.cast(self.add(self.multiply(unit, high - low), low), dtype)

    def normal(self, key: Array, shape: Sequence[int], dtype: str = "float32") -> Array:
        """Standard normal floats (Box-Muller over two uniform draws)."""
        first, second = self.split_key(key, 2)
        u1 = self.subtract(1.0, self.uniform(first, shape))  # in (0, 1]: log is finite
        u2 = self.uniform(second, shape)
        radius = self.sqrt(self.multiply(-2.0, self.log(u1)))
        return self.cast(self.multiply(radius, self.cos(self.multiply(2 * math.pi, u2))), dtype)

    def dropout(self, key: Array, x: Array, rate: float) -> Array:
        """Zero each element with probability ``rate``; scale the rest by ``1/(1-rate)``."""
        if rate == 0:
            return x
        keep = self.greater_equal(self.uniform(key, self.shape(x)), rate)
        return self.where(keep, self.multiply(x, 1.0 / (1.0 - rate)), 0.0)
