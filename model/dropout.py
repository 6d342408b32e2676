"""Dropout from 16-bit random draws, four from each threefry hash.

flax's nn.Dropout draws a float32 uniform per element, one threefry hash (20 rounds over two 32-bit
words) each, and keeps half of the hash's 64 bits. On a CPU those hashes are most of what dropout
costs, and dropout is a large share of a small model's step (docs/performance.md). Here each hash's
64 bits are four 16-bit draws, and an element is kept where its draw is below
`keep_threshold(rate)`: the keep probability is that threshold over 2^16, within 2^-17 of
1 - rate, and kept elements are divided by it, so the output's expectation is x exactly.

The hash counters are iotas over x's own shape, as in jax's partitionable threefry, so a sharded
batch's devices each draw only their own elements.

Dimensions: F the last axis of x, G = ceil(F / 4) hashes along it.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

DRAW_BITS = 16
DRAWS_PER_HASH = 4  # a threefry2x32 hash gives two 32-bit words


def keep_threshold(rate: float) -> int:
  """Draws below this are kept: the keep probability is keep_threshold(rate) / 2^16."""
  return round((1.0 - rate) * 2**DRAW_BITS)


def uniform_draws(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Independent uint16 draws, uniform over [0, 2^16), of `shape` (at least one axis).

  `key` is any PRNG key (typed or raw, any implementation): its own bits seed the hash.
  """
  if not shape:
    raise ValueError('uniform_draws: shape must have at least one axis, got ()')
  groups = (*shape[:-1], -(-shape[-1] // DRAWS_PER_HASH))  # [..., G]
  if math.prod(groups) >= 2**32:
    raise ValueError(f'uniform_draws: shape {shape} needs 2^32 or more hashes; expected fewer')
  keypair = jax.random.bits(key, (2,), jnp.uint32)
  strides = [math.prod(groups[axis + 1:]) for axis in range(len(groups))]
  counts = sum(jax.lax.broadcasted_iota(jnp.uint32, groups, axis) * jnp.uint32(stride)
               for axis, stride in enumerate(strides))  # [..., G] the flat index of each hash
  words = threefry2x32_p.bind(keypair[0], keypair[1], jnp.zeros_like(counts), counts)  # 2 x [..., G]
  draws = jax.lax.bitcast_convert_type(jnp.stack(words, axis=-1), jnp.uint16)  # [..., G, 2, 2]
  return draws.reshape(*groups[:-1], groups[-1] * DRAWS_PER_HASH)[..., :shape[-1]]


class Dropout(nn.Module):
  """Zeroes each element with probability `rate` and divides the rest by the keep probability."""
  rate: float

  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    threshold = keep_threshold(self.rate)
    if deterministic or threshold == 2**DRAW_BITS:
      return x
    if threshold == 0:
      return jnp.zeros_like(x)
    draws = uniform_draws(self.make_rng('dropout'), x.shape)
    keep = draws < threshold
    return jax.lax.select(keep, x / (threshold / 2**DRAW_BITS), jnp.zeros_like(x))
