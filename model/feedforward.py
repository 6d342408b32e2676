"""Position-wise feed-forward networks: D -> F -> D applied to every token alike.

Dimensions: B batch, L length, D model width, F hidden width.
Parameter names follow Xiong et al.'s W1 (expansion) and W2 (contraction), which the
gradient-norm analyses read by name.
"""

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from model import products


class MLP(nn.Module):
  """W2 act(W1 x + b1) + b2 (Vaswani et al. 2017)."""
  d_ff: int
  activation: Callable
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x):
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                              kernel_init=self.kernel_init, dot_general=products.dot_general)
    hidden = self.activation(dense(self.d_ff, name='w1')(x))  # [B, L, F]
    return dense(x.shape[-1], name='w2')(hidden)  # [B, L, D]


class SwiGLU(nn.Module):
  """W2 (silu(W1 x) * W3 x), without biases as in Shazeer (2020) and LLaMA."""
  d_ff: int
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()

  @nn.compact
  def __call__(self, x):
    dense = functools.partial(nn.Dense, use_bias=False, dtype=self.dtype,
                              param_dtype=jnp.float32, kernel_init=self.kernel_init,
                              dot_general=products.dot_general)
    hidden = jax.nn.silu(dense(self.d_ff, name='w1')(x)) * dense(self.d_ff, name='w3')(x)  # [B, L, F]
    return dense(x.shape[-1], name='w2')(hidden)  # [B, L, D]


FEEDFORWARDS = {
    'relu': functools.partial(MLP, activation=jax.nn.relu),
    # Exact erf form, as BERT and fairseq use.
    'gelu': functools.partial(MLP, activation=functools.partial(jax.nn.gelu, approximate=False)),
    'swiglu': SwiGLU,
}
