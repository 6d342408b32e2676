"""Normalisation layers, all computed in float32 whatever the compute dtype.

LayerNorm and RMSNorm are flax's; BatchNorm (padding-aware statistics) and ScaleNorm are written
here because flax has no such layers.

Every norm has the same call signature `norm(x, mask, train)` so the residual wiring in
`blocks.py` can treat them alike: `mask` ([B, L] bool, True at real tokens) matters only to
BatchNorm, whose statistics must not see padding; `train` selects batch statistics vs the
running averages for BatchNorm.

Dimensions: B batch, L length, D model width.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp


class LayerNorm(nn.LayerNorm):
  """(x - mean) / sqrt(var + eps) * scale + bias over the feature axis (Ba et al. 2016).

  flax's own, with the two-pass variance (flax's faster one-pass E[x^2] - E[x]^2 cancels badly
  when |mean| >> std), statistics in float32 and the output in x's dtype.
  """
  epsilon: float = 1e-5
  use_fast_variance: bool = False

  def __call__(self, x, mask: Optional[jnp.ndarray] = None, train: bool = False):
    del mask, train  # per-token statistics: padding and mode do not matter
    # flax returns float32 for bfloat16 inputs (its float32 params promote the result).
    return super().__call__(x).astype(x.dtype)


class RMSNorm(nn.RMSNorm):
  """x / sqrt(mean(x^2) + eps) * scale: LayerNorm without centring or bias (Zhang & Sennrich 2019).

  flax's own, statistics in float32, the output in x's dtype.
  """
  epsilon: float = 1e-5

  def __call__(self, x, mask: Optional[jnp.ndarray] = None, train: bool = False):
    del mask, train
    return super().__call__(x).astype(x.dtype)


class ScaleNorm(nn.Module):
  """g * x / max(||x||, eps) with one learned scalar g initialised to sqrt(D) (Nguyen & Salazar 2019)."""
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x, mask: Optional[jnp.ndarray] = None, train: bool = False):
    del mask, train
    features = x.shape[-1]
    h = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.square(h).sum(-1, keepdims=True))
    g = self.param('scale', nn.initializers.constant(features ** 0.5), ())
    return (g * h / jnp.maximum(norm, self.epsilon)).astype(x.dtype)


class MaskedBatchNorm(nn.Module):
  """BatchNorm over batch x time whose statistics count real tokens only.

  Training normalises with the statistics of this batch's non-padding tokens and updates
  exponential running averages (collection 'batch_stats'); evaluation and decoding use the
  running averages, so a token's output does not depend on the rest of the batch.
  """
  epsilon: float = 1e-5
  # Weight of the old running average in each update (PyTorch's momentum 0.1).
  momentum: float = 0.9

  @nn.compact
  def __call__(self, x, mask: Optional[jnp.ndarray] = None, train: bool = False):
    features = x.shape[-1]
    running_mean = self.variable('batch_stats', 'mean', jnp.zeros, (features,), jnp.float32)
    running_var = self.variable('batch_stats', 'var', jnp.ones, (features,), jnp.float32)
    h = x.astype(jnp.float32)
    if train:
      if mask is None:
        mask = jnp.ones(x.shape[:-1], dtype=bool)
      weights = mask.astype(jnp.float32)[..., None]  # [B, L, 1]
      count = jnp.maximum(weights.sum(), 1.0)
      mean = (h * weights).sum((0, 1)) / count  # [D]
      var = (jnp.square(h - mean) * weights).sum((0, 1)) / count  # [D]
      if not self.is_initializing():
        running_mean.value = self.momentum * running_mean.value + (1 - self.momentum) * mean
        running_var.value = self.momentum * running_var.value + (1 - self.momentum) * var
    else:
      mean, var = running_mean.value, running_var.value
    h = (h - mean) * jnp.reciprocal(jnp.sqrt(var + self.epsilon))
    h = h * self.param('scale', nn.initializers.ones, (features,))
    h = h + self.param('bias', nn.initializers.zeros, (features,))
    return h.astype(x.dtype)


NORMS = {
    'layer': LayerNorm,
    'rms': RMSNorm,
    'batch': MaskedBatchNorm,
    'scale': ScaleNorm,
}
