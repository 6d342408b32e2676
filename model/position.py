"""Position information: absolute tables added to embeddings, and rotary embeddings.

Dimensions: B batch, L length, D model width, N heads, H head dim.

- 'sinusoidal': fixed table of Vaswani et al. (2017) added to the scaled embeddings.
- 'learned': a trained [max_position, D] table added to the embeddings.
- 'rope': rotary embeddings (Su et al. 2021) applied to queries and keys after their
  projection in self-attention; nothing is added to the embeddings and values are untouched.
- 'none': no position information (the decoder still sees order through its causal mask).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

MAX_WAVELENGTH = 10_000


def sinusoidal_table(length: int, dim: int) -> jnp.ndarray:
  """PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(pos / 10000^(2i/dim)).

  Args:
    length: number of positions.
    dim: even feature width.

  Returns:
    [length, dim] float32.
  """
  if dim % 2:
    raise ValueError(f'sinusoidal_table needs an even dim, got {dim}')
  positions = np.arange(length, dtype=np.float64)[:, None]  # [L, 1]
  inv_freq = MAX_WAVELENGTH ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # [D/2]
  angles = positions * inv_freq  # [L, D/2]
  table = np.empty((length, dim), dtype=np.float64)
  table[:, 0::2] = np.sin(angles)
  table[:, 1::2] = np.cos(angles)
  return jnp.asarray(table, dtype=jnp.float32)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray,
               max_wavelength: int = MAX_WAVELENGTH) -> jnp.ndarray:
  """Rotates each pair of features of x by an angle proportional to its position.

  Feature i of the first half is paired with feature i of the second half (the layout of
  gemma and GPT-NeoX; RoFormer pairs neighbours, which is the same up to a fixed permutation
  of the head dimensions that the projections absorb). Pair i at position p turns by
  p * max_wavelength^(-2i/H), so <apply_rope(q, i), apply_rope(k, j)> depends on i - j only.

  Args:
    x: [B, L, N, H] queries or keys, H even.
    positions: [B, L] integer positions.
    max_wavelength: base of the geometric frequency progression.

  Returns:
    [B, L, N, H], same dtype as x; the rotation is computed in float32.
  """
  head_dim = x.shape[-1]
  if head_dim % 2:
    raise ValueError(f'apply_rope needs an even head dim, got {head_dim}')
  inv_freq = max_wavelength ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # [H/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, H/2]
  sin = jnp.sin(angles)[:, :, None, :]  # [B, L, 1, H/2]
  cos = jnp.cos(angles)[:, :, None, :]  # [B, L, 1, H/2]
  first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # 2 x [B, L, N, H/2]
  rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return rotated.astype(x.dtype)


class SinusoidalPositions(nn.Module):
  """Adds the fixed sinusoidal table at `positions`."""
  max_position: int

  @nn.compact
  def __call__(self, x, positions):
    table = sinusoidal_table(self.max_position, x.shape[-1])  # [P, D]
    return x + table[positions].astype(x.dtype)


class LearnedPositions(nn.Module):
  """Adds a trained absolute position table at `positions`."""
  max_position: int

  @nn.compact
  def __call__(self, x, positions):
    table = self.param('embedding', nn.initializers.normal(stddev=x.shape[-1] ** -0.5),
                       (self.max_position, x.shape[-1]))  # [P, D]
    return x + table[positions].astype(x.dtype)


class NoAddedPositions(nn.Module):
  """For 'rope' (positions enter inside attention) and 'none'."""
  max_position: int

  def __call__(self, x, positions):
    del positions
    return x


POSITIONS = {
    'sinusoidal': SinusoidalPositions,
    'learned': LearnedPositions,
    'rope': NoAddedPositions,
    'none': NoAddedPositions,
}

# Position kinds that rotate queries and keys inside self-attention.
ROTARY = frozenset({'rope'})
