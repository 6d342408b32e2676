"""Residual wiring: the only place that knows where norms sit around a sublayer.

A placement says how one sublayer f (attention or FFN, dropout included) is joined to the
residual stream x, how many norms it needs, and whether the stack ends with a final norm:
  'post'  x <- N(x + f(x))          Vaswani et al. (2017); no final norm.
  'pre'   x <- x + f(N(x))          Xiong et al. (2020); final norm after the last layer.
With `residual=False` the '+ x' is dropped, the ablation the lectures describe. Another
placement (sandwich x + N2(f(N1(x))), DeepNorm N(a x + f(x))) is one more `Placement`.

Dimensions: B batch, S source length, T target length, D model width; in decoding K hypotheses
per sentence and R = B * K rows.
"""

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from model.attention import Cache, MultiHeadAttention
from model.feedforward import FEEDFORWARDS
from model.fusion import fusion_boundary
from model.norms import NORMS
from model.position import ROTARY

# A sublayer maps the (possibly normalised) stream to its output and an auxiliary value
# (the updated cache of a decoding step, else None).
Sublayer = Callable[[jnp.ndarray], tuple[jnp.ndarray, Any]]
Norm = Callable[[jnp.ndarray], jnp.ndarray]


def _post_norm(x, sublayer: Sublayer, norms: Sequence[Norm], residual: bool):
  (norm,) = norms
  y, aux = sublayer(x)
  return norm(x + y if residual else y), aux


def _pre_norm(x, sublayer: Sublayer, norms: Sequence[Norm], residual: bool):
  (norm,) = norms
  y, aux = sublayer(norm(x))
  return (x + y if residual else y), aux


@dataclasses.dataclass(frozen=True)
class Placement:
  # (x, sublayer, norms, residual) -> (new x, sublayer's auxiliary output).
  connect: Callable
  # Norm modules each sublayer owns.
  norms_per_sublayer: int
  # Whether each stack ends with its own norm.
  final_norm: bool


PLACEMENTS = {
    'post': Placement(_post_norm, norms_per_sublayer=1, final_norm=False),
    'pre': Placement(_pre_norm, norms_per_sublayer=1, final_norm=True),
}


class _Layer(nn.Module):
  """What encoder and decoder layers share: norms, dropout, FFN and the wiring."""
  config: Any  # model.config.ModelConfig

  def make_norms(self, name: str):
    cfg = self.config
    count = PLACEMENTS[cfg.norm_position].norms_per_sublayer
    return [NORMS[cfg.norm](epsilon=cfg.norm_epsilon, name=f'{name}_{i}') for i in range(count)]

  def make_attention(self, rotary: bool, name: str):
    cfg = self.config
    return MultiHeadAttention(d_model=cfg.d_model, num_heads=cfg.num_heads, impl=cfg.attention_impl,
                              rotary=rotary, dropout_rate=cfg.attention_dropout_rate,
                              dtype=cfg.compute_dtype, kernel_init=cfg.initializer, name=name)

  def setup_shared(self):
    cfg = self.config
    self.ffn = FEEDFORWARDS[cfg.activation](d_ff=cfg.d_ff, dtype=cfg.compute_dtype,
                                            kernel_init=cfg.initializer, name='ffn')
    self.ffn_norms = self.make_norms('ffn_norm')
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def connect(self, x, sublayer: Sublayer, norms, token_mask, train: bool):
    """Joins `sublayer` (followed by dropout) to the stream x with the configured placement."""
    cfg = self.config
    bound_norms = [lambda h, n=n: n(h, token_mask, train) for n in norms]

    def with_dropout(h):
      y, aux = sublayer(h)
      return self.dropout(y, deterministic=not train), aux

    x, aux = PLACEMENTS[cfg.norm_position].connect(x, with_dropout, bound_norms, cfg.residual)
    # The stream after each sublayer is computed once, not again inside every later consumer.
    return fusion_boundary(x), aux

  def feed_forward(self, x, token_mask, train: bool):
    x, _ = self.connect(x, lambda h: (self.ffn(h), None), self.ffn_norms, token_mask, train)
    return x


class EncoderLayer(_Layer):
  """Self-attention then FFN over the source."""

  def setup(self):
    self.setup_shared()
    self.self_attention = self.make_attention(self.config.position in ROTARY, 'self_attention')
    self.self_attention_norms = self.make_norms('self_attention_norm')

  def __call__(self, x, token_mask, attention_mask, positions, train: bool = False):
    """x [B, S, D]; token_mask [B, S]; attention_mask [B, 1, S, S]; positions [B, S]."""
    attend = lambda h: (self.self_attention(h, attention_mask, positions, deterministic=not train), None)
    x, _ = self.connect(x, attend, self.self_attention_norms, token_mask, train)
    return self.feed_forward(x, token_mask, train)


class DecoderLayer(_Layer):
  """Causal self-attention, cross-attention to the encoder output, then FFN."""

  def setup(self):
    self.setup_shared()
    self.self_attention = self.make_attention(self.config.position in ROTARY, 'self_attention')
    self.self_attention_norms = self.make_norms('self_attention_norm')
    # RoPE is for self-attention only: source and target positions are not comparable.
    self.cross_attention = self.make_attention(False, 'cross_attention')
    self.cross_attention_norms = self.make_norms('cross_attention_norm')

  def project_cross_kv(self, encoded) -> Cache:
    """Cross-attention keys/values of the encoder output [B, S, D], computed once per source."""
    return self.cross_attention.project_kv(encoded)

  def _cross_and_ffn(self, x, cross_kv, cross_mask, token_mask, train):
    attend = lambda h: (self.cross_attention.cross(h, cross_kv, cross_mask, deterministic=not train), None)
    x, _ = self.connect(x, attend, self.cross_attention_norms, token_mask, train)
    return self.feed_forward(x, token_mask, train)

  def __call__(self, x, encoded, token_mask, self_mask, cross_mask, positions, train: bool = False):
    """Teacher-forced pass. x [B, T, D]; encoded [B, S, D]; token_mask [B, T];
    self_mask [B, 1, T, T]; cross_mask [B, 1, T, S]; positions [B, T]."""
    attend = lambda h: (self.self_attention(h, self_mask, positions, deterministic=not train), None)
    x, _ = self.connect(x, attend, self.self_attention_norms, token_mask, train)
    return self._cross_and_ffn(x, self.project_cross_kv(encoded), cross_mask, token_mask, train)

  def decode_step(self, x, self_cache: Cache, cross_kv: Cache, cross_mask, position_index):
    """One token per hypothesis x [R, 1, D] at `position_index`. Returns (x, new self cache).

    cross_kv [B, S, N, H] and cross_mask [B, 1, 1, S] have one row per sentence, R = B * K with
    a sentence's K hypotheses adjacent: they attend as the K queries of their sentence's row.
    """
    attend = lambda h: self.self_attention.decode_step(h, self_cache, position_index)
    x, self_cache = self.connect(x, attend, self.self_attention_norms, None, False)
    rows, _, width = x.shape
    x = x.reshape(cross_mask.shape[0], -1, width)  # [R, 1, D] -> [B, K, D]
    x = self._cross_and_ffn(x, cross_kv, cross_mask, None, False)
    return x.reshape(rows, 1, width), self_cache

  def empty_self_cache(self, batch_size: int, length: int) -> Cache:
    return self.self_attention.empty_cache(batch_size, length)
