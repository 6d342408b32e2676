"""Multi-head scaled dot-product attention: self, cross, and one cached decoding step.

Dimensions: B batch, T query length, S key length, D model width, N heads, H head dim,
C self-attention cache slots, K hypotheses per sentence.

The decoding caches are plain dict pytrees passed in and returned, laid out as a step's two
products read them (each key slot a column), so no step transposes a whole cache: on CPU those
transposes took 40% of a beam-search step:
  self-attention  {'key': [B, N, H, C*K], 'value': [B, N, C*K, H]}, a sentence's K hypotheses in
                  one row, entry c * K + k for slot c of column k, filled one slot per step;
  cross-attention {'key': [B, N, H, S], 'value': [B, N, S, H]}, projected once per source
  batch by `project_source_cache` and only read afterwards.
Attention logits and softmax are float32 whatever the compute dtype.
"""

from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from model import position, products
from model.dropout import Dropout

Cache = dict[str, jnp.ndarray]


def attention_weights(query, key, mask, bias=None):
  """softmax(Q K^T / sqrt(H) + bias) with masked logits: float32 [B, N, T, S].

  Args:
    query: [B, T, N, H].
    key: [B, S, N, H].
    mask: bool, broadcastable to [B, N, T, S]; True where attending is allowed.
    bias: float32 broadcastable to [B, N, T, S] (ALiBi), or None.
  """
  query = query * jnp.asarray(query.shape[-1] ** -0.5, query.dtype)
  logits = products.einsum('BTNH,BSNH->BNTS', query, key, jnp.float32)  # [B, N, T, S]
  if bias is not None:
    logits = logits + bias
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def xla_attention(query, key, value, mask, dropout, bias=None):
  """softmax(Q K^T / sqrt(H) + bias) V with masked logits, as portable einsums.

  Args:
    query: [B, T, N, H].
    key: [B, S, N, H].
    value: [B, S, N, H].
    mask: bool, broadcastable to [B, N, T, S]; True where attending is allowed.
    dropout: applied to the attention probabilities.
    bias: float32 broadcastable to [B, N, T, S], or None.

  Returns:
    [B, T, N, H] in the dtype of `value`.
  """
  probs = dropout(attention_weights(query, key, mask, bias))  # [B, N, T, S]
  return products.einsum('BNTS,BSNH->BTNH', probs.astype(value.dtype), value)  # [B, T, N, H]


def _fused_attention(implementation: Optional[str]) -> Callable:
  """`jax.nn.dot_product_attention` with the given backend; it has no probability dropout."""

  def attend(query, key, value, mask, dropout, bias=None):
    del dropout  # ModelConfig rejects attention dropout for fused kernels.
    mask = jnp.broadcast_to(mask, (query.shape[0], 1, query.shape[1], key.shape[1]))  # [B, 1, T, S]
    if bias is not None:
      bias = bias.astype(query.dtype)
    return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                        implementation=implementation)

  return attend


ATTENTION_IMPLS = {
    'xla': xla_attention,
    # jax's reference kernel: the fused code path, testable on CPU.
    'jax': _fused_attention(None),
    # cuDNN flash attention on NVIDIA GPUs (float16/bfloat16 inputs).
    'cudnn': _fused_attention('cudnn'),
}


class HeadProjection(nn.Module):
  """The kernel [D, N, H] and bias [N, H] of one of Q, K, V: the parameters nn.DenseGeneral((N, H))
  makes (same names, shapes and initial values), returned rather than applied, so that the
  projections of one input run as one product (`MultiHeadAttention._project`)."""
  num_heads: int
  head_dim: int
  kernel_init: Callable

  @nn.compact
  def __call__(self, d_model: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    # DenseGeneral initialises the kernel flattened to [D, N * H].
    init = lambda key, shape, dtype: self.kernel_init(
        key, (shape[0], shape[1] * shape[2]), dtype).reshape(shape)
    kernel = self.param('kernel', init, (d_model, self.num_heads, self.head_dim), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (self.num_heads, self.head_dim), jnp.float32)
    return kernel, bias


class MultiHeadAttention(nn.Module):
  """Projections Q, K, V (with biases, as fairseq) and the output projection O."""
  d_model: int
  num_heads: int
  impl: str = 'xla'
  # Rotate queries and keys by their positions (self-attention with position='rope').
  rotary: bool = False
  # Add ALiBi's -m_h |i - j| to the logits (self-attention with position='alibi').
  linear_bias: bool = False
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()
  # Init of the value and output projections (DeepNorm scales them); None: kernel_init.
  value_out_init: Optional[Callable] = None

  def setup(self):
    head_dim = self.d_model // self.num_heads
    projection = lambda name, init: HeadProjection(self.num_heads, head_dim, init, name=name)
    value_out_init = self.value_out_init or self.kernel_init
    self.query = projection('query', self.kernel_init)
    self.key = projection('key', self.kernel_init)
    self.value = projection('value', value_out_init)
    self.out = nn.DenseGeneral(self.d_model, axis=(-2, -1), dtype=self.dtype,
                               param_dtype=jnp.float32, kernel_init=value_out_init,
                               dot_general=products.dot_general, name='out')
    self.attention_dropout = Dropout(self.dropout_rate)

  def _attend(self, query, key, value, mask, deterministic, bias=None):
    dropout = lambda probs: self.attention_dropout(probs, deterministic=deterministic)
    attended = ATTENTION_IMPLS[self.impl](query, key, value, mask, dropout, bias)  # [B, T, N, H]
    return self.out(attended)  # [B, T, D]

  def _project(self, inputs: jnp.ndarray, projections: Sequence[HeadProjection]) -> list[jnp.ndarray]:
    """`inputs` [B, L, D] through several of Q, K, V as one product, their kernels side by side:
    on CPU one [D, 3D] product of a slice's rows costs less than three [D, D] ones
    (docs/performance.md). Returns [B, L, N, H] per projection."""
    weights = [projection(inputs.shape[-1]) for projection in projections]
    kernel = jnp.concatenate([kernel for kernel, _ in weights], axis=1)  # [D, P * N, H]
    bias = jnp.concatenate([bias for _, bias in weights], axis=0)  # [P * N, H]
    projected = (products.dense(inputs.astype(self.dtype), kernel)
                 + bias.astype(self.dtype))  # [B, L, P * N, H]
    return jnp.split(projected, len(projections), axis=-2)

  def _rotate(self, query_or_key, positions):
    """RoPE of queries or keys [B, L, N, H] where this attention uses it."""
    return position.apply_rope(query_or_key, positions) if self.rotary else query_or_key

  def project_kv(self, inputs: jnp.ndarray, positions: Optional[jnp.ndarray] = None) -> Cache:
    """Keys and values of `inputs` [B, S, D]: the cross-attention cache of one source batch."""
    key, value = self._project(inputs, [self.key, self.value])  # [B, S, N, H] each
    return {'key': self._rotate(key, positions), 'value': value}

  def _project_qkv(self, x, positions):
    """Queries, keys and values of x [B, T, D] for self-attention: [B, T, N, H] each."""
    query, key, value = self._project(x, [self.query, self.key, self.value])
    return self._rotate(query, positions), self._rotate(key, positions), value

  def __call__(self, x, mask, positions=None, *, deterministic: bool = True):
    """Self-attention of x [B, T, D] under `mask` [B, 1, T, T]."""
    query, key, value = self._project_qkv(x, positions)
    bias = position.alibi_bias(positions, positions, self.num_heads) if self.linear_bias else None  # [B, N, T, T]
    return self._attend(query, key, value, mask, deterministic, bias)

  def cross(self, x, kv: Cache, mask, *, deterministic: bool = True):
    """Attention of x [B, T, D] to precomputed keys/values (`project_kv`) under `mask` [B, 1, T, S].

    With 'intermediates' mutable (scripts/attention_maps.py) it also records the attention
    weights [B, N, T, S] as `attention_weights`.
    """
    (query,) = self._project(x, [self.query])  # [B, T, N, H]
    if self.is_mutable_collection('intermediates'):
      self.sow('intermediates', 'attention_weights', attention_weights(query, kv['key'], mask))
    return self._attend(query, kv['key'], kv['value'], mask, deterministic)

  def project_source_cache(self, inputs: jnp.ndarray) -> Cache:
    """Cross-attention keys [B, N, H, S] and values [B, N, S, H] of the encoder output
    [B, S, D], in the layout `cross_step` reads: a loop-invariant transpose is not hoisted out
    of the decoding loop, so the [B, S, N, H] layout cost two transposes per layer and step in
    the HLO (beam search was no faster without them on the 2026-11-25 Intel VM, nor slower)."""
    kv = self.project_kv(inputs)  # 2 x [B, S, N, H]
    return {'key': kv['key'].transpose(0, 2, 3, 1), 'value': kv['value'].transpose(0, 2, 1, 3)}

  def _cached_attention(self, query, cache: Cache, mask, bias=None):
    """`xla_attention`'s products over a decoding cache's layout: query [B, T, N, H], keys
    [B, N, H, C], values [B, N, C, H], mask and bias broadcastable to [B, N, T, C]."""
    query = query * jnp.asarray(query.shape[-1] ** -0.5, query.dtype)
    logits = jnp.einsum('BTNH,BNHC->BNTC', query, cache['key'],
                        preferred_element_type=jnp.float32)  # [B, N, T, C]
    if bias is not None:
      logits = logits + bias
    probs = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    value = cache['value']
    attended = jnp.einsum('BNTC,BNCH->BNTH', probs.astype(value.dtype), value)  # [B, N, T, H]
    return self.out(attended.transpose(0, 2, 1, 3))  # [B, T, N, H] -> [B, T, D]

  def cross_step(self, x, source_cache: Cache, mask):
    """Attention of x [B, T, D] (a sentence's hypotheses as its T queries) to one source batch's
    `project_source_cache` under `mask` [B, 1, 1, S], whatever `impl` the full passes use."""
    (query,) = self._project(x, [self.query])  # [B, T, N, H]
    return self._cached_attention(query, source_cache, mask)

  def decode_step(self, x, cache: Cache, position_index, mask) -> tuple[jnp.ndarray, Cache]:
    """Self-attention of one new token per hypothesis, x [B, K, D], at `position_index`.

    Writes the K hypotheses' keys and values into slot `position_index` of their sentence's
    cache row and attends, as K queries, to the slots and rows `mask` [B, 1, K, C*K] allows: each
    hypothesis's own history (`Transformer.decode_step`), which is what the causal mask allows in
    the full pass. Beam search never moves these rows: a re-ranked hypothesis keeps reading its
    ancestors' slots where they were written. The products are `xla_attention`'s, over the
    cache's layout, whatever `impl` the full passes use.
    """
    batch, beams, _ = x.shape
    positions = jnp.full((batch, beams), position_index, dtype=jnp.int32)  # [B, K]
    query, new_key, new_value = self._project_qkv(x, positions)  # [B, K, N, H] each
    # Slot c of column k is entry c * K + k: one write per step, and the products read the very
    # buffer written (a reshaped view made XLA write it twice, one copy per reader).
    key = jax.lax.dynamic_update_slice_in_dim(
        cache['key'], new_key.transpose(0, 2, 3, 1).astype(cache['key'].dtype),
        position_index * beams, axis=3)  # [B, N, H, C*K]
    value = jax.lax.dynamic_update_slice_in_dim(
        cache['value'], new_value.transpose(0, 2, 1, 3).astype(cache['value'].dtype),
        position_index * beams, axis=2)  # [B, N, C*K, H]
    cache = {'key': key, 'value': value}
    bias = None
    if self.linear_bias:  # entry c * K + k holds position c
      key_positions = jnp.arange(key.shape[-1])[None] // beams  # [1, C*K]
      bias = position.alibi_bias(positions[:1, :1], key_positions, self.num_heads)  # [1, N, 1, C*K]
    return self._cached_attention(query, cache, mask, bias), cache

  def empty_cache(self, batch_size: int, beam_size: int, length: int) -> Cache:
    """Zero self-attention cache of `length` slots for the `beam_size` hypotheses of each of
    `batch_size` sentences, a sentence's hypotheses in one row."""
    head_dim = self.d_model // self.num_heads
    slots = length * beam_size
    return {'key': jnp.zeros((batch_size, self.num_heads, head_dim, slots), self.dtype),  # [B, N, H, C*K]
            'value': jnp.zeros((batch_size, self.num_heads, slots, head_dim), self.dtype)}  # [B, N, C*K, H]
