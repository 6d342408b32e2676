"""Position information: absolute tables added to embeddings, and rotary embeddings.

Dimensions: B batch, L length, D model width, N heads, H head dim.

- 'sinusoidal': fixed table of Vaswani et al. (2017) added to the scaled embeddings.
- 'learned': a trained [max_position, D] table added to the embeddings.
- 'rope': rotary embeddings (Su et al. 2021) applied to queries and keys after their
  projection in self-attention; nothing is added to the embeddings and values are untouched.
- 'alibi': attention with linear biases (Press et al. 2022): self-attention logits get
  -m_h * |i - j|, one fixed slope m_h per head; nothing is added to the embeddings. The paper's
  decoder is causal, where |i - j| = i - j; the encoder uses the same symmetric distance.
- 'none': no position information (the decoder still sees order through its causal mask).

Beyond the lengths seen in training: sinusoidal, RoPE and ALiBi are closed forms defined at every
position. The learned table has max_position rows (config.model.max_position, 1024 by default,
far beyond any Multi30k sentence); rows of positions no training sentence reached get no gradient
and keep their random initial values, which is exactly what a learned table has to offer there.
"""

import math

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


def alibi_slopes(num_heads: int) -> np.ndarray:
  """The heads' slopes m_h of Press et al. (2022), as their reference code computes them.

  For N a power of two: 2^(-8/N), 2^(-16/N), ..., 2^(-8). Otherwise the slopes of the largest
  power of two P < N, followed by every other slope of 2P, up to N in all.

  Returns:
    [N] float32.
  """
  def power_of_two_slopes(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]

  if num_heads < 1:
    raise ValueError(f'alibi_slopes needs at least one head, got {num_heads}')
  lower = 2 ** math.floor(math.log2(num_heads))
  slopes = power_of_two_slopes(lower)
  if lower < num_heads:
    slopes += power_of_two_slopes(2 * lower)[0::2][:num_heads - lower]
  return np.asarray(slopes, dtype=np.float32)


def alibi_bias(query_positions: jnp.ndarray, key_positions: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """-m_h * |i - j|: ALiBi's additive attention-logit bias between query position i and key position j.

  Args:
    query_positions: [B, T] integer positions.
    key_positions: [B, S] integer positions.
    num_heads: N.

  Returns:
    [B, N, T, S] float32.
  """
  distance = jnp.abs(query_positions[:, :, None] - key_positions[:, None, :]).astype(jnp.float32)  # [B, T, S]
  return -jnp.asarray(alibi_slopes(num_heads))[None, :, None, None] * distance[:, None]


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
  """For 'rope' and 'alibi' (positions enter inside attention) and 'none'."""
  max_position: int

  def __call__(self, x, positions):
    del positions
    return x


POSITIONS = {
    'sinusoidal': SinusoidalPositions,
    'learned': LearnedPositions,
    'rope': NoAddedPositions,
    'alibi': NoAddedPositions,
    'none': NoAddedPositions,
}

# Position kinds that rotate queries and keys inside self-attention.
ROTARY = frozenset({'rope'})
# Position kinds that add a distance bias to self-attention logits.
LINEAR_BIAS = frozenset({'alibi'})
