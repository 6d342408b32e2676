"""Residual wiring: the only place that knows where norms sit around a sublayer.

A placement says how one sublayer f (attention or FFN) and its dropout D are joined to the
residual stream x, how many norms it needs, whether the stack ends with a final norm, and how
it scales the residual branch and the initial weights:
  'post'      x <- N(x + D(f(x)))             Vaswani et al. (2017); no final norm.
  'pre'       x <- x + D(f(N(x)))             Xiong et al. (2020); final norm after the last layer.
  'sandwich'  x <- x + D(N2(f(N1(x))))        Ding et al. (2021, CogView's Sandwich-LN); final norm.
  'deepnorm'  x <- N(a x + D(f(x)))           Wang et al. (2022, DeepNet); no final norm. With N
              encoder and M decoder layers: encoder a = 0.81 (N^4 M)^(1/16), decoder a = (3M)^(1/4),
              and the value and output projections of every attention and both FFN matrices start
              at b times the configured init: encoder b = 0.87 (N^4 M)^(-1/16), decoder b = (12M)^(-1/4).
              Queries and keys keep their init.
  'admin'     x <- N(w * x + D(f(x)))         Liu et al. (2020, Admin); no final norm. w is a
              trained [D] vector per sublayer (`<sublayer>_residual_weight`), 1 as created (plain
              Post-LN) and set from a profiling pass by `model/admin.py` before training.
With `residual=False` the skip term (x, a x or w * x) is dropped, the ablation the lectures
describe.

Dimensions: B batch, S source length, T target length, D model width; in decoding K hypotheses
per sentence and R = B * K rows.
"""

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

from model.attention import Cache, MultiHeadAttention
from model.dropout import Dropout
from model.feedforward import FEEDFORWARDS
from model.fusion import fusion_boundary
from model.norms import NORMS
from model.position import LINEAR_BIAS, ROTARY

# A sublayer maps the (possibly normalised) stream to its output and an auxiliary value
# (the updated cache of a decoding step, else None).
Sublayer = Callable[[jnp.ndarray], tuple[jnp.ndarray, Any]]
Norm = Callable[[jnp.ndarray], jnp.ndarray]


def _post_norm(x, sublayer: Sublayer, norms: Sequence[Norm], dropout: Norm, residual: bool, alpha: float):
  del alpha
  (norm,) = norms
  y, aux = sublayer(x)
  return norm(x + dropout(y) if residual else dropout(y)), aux


def _pre_norm(x, sublayer: Sublayer, norms: Sequence[Norm], dropout: Norm, residual: bool, alpha: float):
  del alpha
  (norm,) = norms
  y, aux = sublayer(norm(x))
  return (x + dropout(y) if residual else dropout(y)), aux


def _sandwich_norm(x, sublayer: Sublayer, norms: Sequence[Norm], dropout: Norm, residual: bool,
                   alpha: float):
  del alpha
  inner, outer = norms
  y, aux = sublayer(inner(x))
  y = dropout(outer(y))
  return (x + y if residual else y), aux


def _deep_norm(x, sublayer: Sublayer, norms: Sequence[Norm], dropout: Norm, residual: bool, alpha: float):
  (norm,) = norms
  y, aux = sublayer(x)
  return norm(alpha * x + dropout(y) if residual else dropout(y)), aux


def _unit_scale(num_encoder_layers: int, num_decoder_layers: int, decoder: bool) -> float:
  del num_encoder_layers, num_decoder_layers, decoder
  return 1.0


def deepnorm_alpha(num_encoder_layers: int, num_decoder_layers: int, decoder: bool) -> float:
  """DeepNet's residual weight a for an encoder-decoder (Wang et al. 2022, Table 1)."""
  if decoder:
    return (3 * num_decoder_layers) ** 0.25
  return 0.81 * (num_encoder_layers ** 4 * num_decoder_layers) ** (1 / 16)


def deepnorm_beta(num_encoder_layers: int, num_decoder_layers: int, decoder: bool) -> float:
  """DeepNet's init gain b for an encoder-decoder (Wang et al. 2022, Table 1)."""
  if decoder:
    return (12 * num_decoder_layers) ** -0.25
  return 0.87 * (num_encoder_layers ** 4 * num_decoder_layers) ** (-1 / 16)


@dataclasses.dataclass(frozen=True)
class Placement:
  # (x, sublayer, norms, dropout, residual, alpha) -> (new x, sublayer's auxiliary output).
  connect: Callable
  # Norm modules each sublayer owns.
  norms_per_sublayer: int
  # Whether each stack ends with its own norm.
  final_norm: bool
  # (num_encoder_layers, num_decoder_layers, decoder) -> weight of x in the residual sum.
  residual_weight: Callable[[int, int, bool], float] = _unit_scale
  # (num_encoder_layers, num_decoder_layers, decoder) -> gain of the value, attention-output and
  # FFN initial weights.
  init_gain: Callable[[int, int, bool], float] = _unit_scale
  # Whether the weight of x is a trained [D] vector per sublayer instead of residual_weight.
  trained_residual_weight: bool = False


PLACEMENTS = {
    'post': Placement(_post_norm, norms_per_sublayer=1, final_norm=False),
    'pre': Placement(_pre_norm, norms_per_sublayer=1, final_norm=True),
    'sandwich': Placement(_sandwich_norm, norms_per_sublayer=2, final_norm=True),
    'deepnorm': Placement(_deep_norm, norms_per_sublayer=1, final_norm=False,
                          residual_weight=deepnorm_alpha, init_gain=deepnorm_beta),
    'admin': Placement(_deep_norm, norms_per_sublayer=1, final_norm=False,
                       trained_residual_weight=True),
}

# Admin's profiling pass records, per sublayer, the variances of its input x and of its output f(x)
# in this collection (model/admin.py).
RESIDUAL_VARIANCES = 'residual_variances'


def scaled_init(init: Callable, gain: float) -> Callable:
  """`init` times `gain` (DeepNet's b); `init` itself for a gain of 1."""
  if gain == 1.0:
    return init
  return lambda key, shape, dtype=jnp.float32: gain * init(key, shape, dtype)


class _Layer(nn.Module):
  """What encoder and decoder layers share: norms, dropout, FFN and the wiring."""
  config: Any  # model.config.ModelConfig
  # Whether the layer is in the decoder stack (DeepNorm's a and b differ there).
  is_decoder = False

  def _placement_scale(self, name: str) -> float:
    cfg = self.config
    return getattr(PLACEMENTS[cfg.norm_position], name)(cfg.num_encoder_layers, cfg.num_decoder_layers,
                                                        self.is_decoder)

  def make_joint(self, sublayer: str):
    """The norms of `sublayer` (attribute `<sublayer>_norms`) and, where the placement trains it,
    the weight of its skip term (`<sublayer>_residual_weight`); `connect` reads both."""
    cfg = self.config
    placement = PLACEMENTS[cfg.norm_position]
    setattr(self, f'{sublayer}_norms', [NORMS[cfg.norm](epsilon=cfg.norm_epsilon, name=f'{sublayer}_norm_{i}')
                                        for i in range(placement.norms_per_sublayer)])
    if placement.trained_residual_weight:
      setattr(self, f'{sublayer}_residual_weight',
              self.param(f'{sublayer}_residual_weight', nn.initializers.ones, (cfg.d_model,), jnp.float32))

  def make_attention(self, self_attention: bool, name: str):
    """Self-attention sees positions as configured (RoPE, ALiBi); cross-attention never does:
    source and target positions are not comparable."""
    cfg = self.config
    return MultiHeadAttention(d_model=cfg.d_model, num_heads=cfg.num_heads, impl=cfg.attention_impl,
                              rotary=self_attention and cfg.position in ROTARY,
                              linear_bias=self_attention and cfg.position in LINEAR_BIAS,
                              dropout_rate=cfg.attention_dropout_rate,
                              dtype=cfg.compute_dtype, kernel_init=cfg.initializer,
                              value_out_init=scaled_init(cfg.initializer, self._placement_scale('init_gain')),
                              name=name)

  def setup_shared(self):
    cfg = self.config
    self.ffn = FEEDFORWARDS[cfg.activation](
        d_ff=cfg.d_ff, dtype=cfg.compute_dtype,
        kernel_init=scaled_init(cfg.initializer, self._placement_scale('init_gain')), name='ffn')
    self.make_joint('ffn')
    self.dropout = Dropout(cfg.dropout_rate)

  def connect(self, x, sublayer: Sublayer, name: str, token_mask, train: bool):
    """Joins `sublayer` (followed by dropout), whose norms and weights `make_joint(name)` made,
    to the stream x with the configured placement."""
    cfg = self.config
    placement = PLACEMENTS[cfg.norm_position]
    bound_norms = [lambda h, n=n: n(h, token_mask, train) for n in getattr(self, f'{name}_norms')]
    dropout = lambda y: self.dropout(y, deterministic=not train)
    alpha = self._placement_scale('residual_weight')
    if placement.trained_residual_weight:
      alpha = getattr(self, f'{name}_residual_weight').astype(x.dtype)  # [D]
      if self.is_mutable_collection(RESIDUAL_VARIANCES):
        sublayer = self._recording_variances(x, sublayer, name)
    x, aux = placement.connect(x, sublayer, bound_norms, dropout, cfg.residual, alpha)
    # The stream after each sublayer is computed once, not again inside every later consumer.
    return fusion_boundary(x), aux

  def _recording_variances(self, x, sublayer: Sublayer, name: str) -> Sublayer:
    """`sublayer`, recording Var[x] and Var[f(x)] over all elements (Admin's profile; model/admin.py
    feeds a batch without padding, dropout off)."""
    def recorded(h):
      y, aux = sublayer(h)
      variances = jnp.stack([jnp.var(x.astype(jnp.float32)), jnp.var(y.astype(jnp.float32))])
      self.sow(RESIDUAL_VARIANCES, f'{name}_variances', variances)
      return y, aux
    return recorded

  def feed_forward(self, x, token_mask, train: bool):
    x, _ = self.connect(x, lambda h: (self.ffn(h), None), 'ffn', token_mask, train)
    return x


class EncoderLayer(_Layer):
  """Self-attention then FFN over the source."""

  def setup(self):
    self.setup_shared()
    self.self_attention = self.make_attention(True, 'self_attention')
    self.make_joint('self_attention')

  def __call__(self, x, token_mask, attention_mask, positions, train: bool = False):
    """x [B, S, D]; token_mask [B, S]; attention_mask [B, 1, S, S]; positions [B, S]."""
    attend = lambda h: (self.self_attention(h, attention_mask, positions, deterministic=not train), None)
    x, _ = self.connect(x, attend, 'self_attention', token_mask, train)
    return self.feed_forward(x, token_mask, train)


class DecoderLayer(_Layer):
  """Causal self-attention, cross-attention to the encoder output, then FFN."""
  is_decoder = True

  def setup(self):
    self.setup_shared()
    self.self_attention = self.make_attention(True, 'self_attention')
    self.make_joint('self_attention')
    self.cross_attention = self.make_attention(False, 'cross_attention')
    self.make_joint('cross_attention')

  def project_source_cache(self, encoded) -> Cache:
    """Cross-attention keys/values of the encoder output [B, S, D] for decoding, computed once
    per source batch."""
    return self.cross_attention.project_source_cache(encoded)

  def _cross_and_ffn(self, x, attend_source, token_mask, train):
    x, _ = self.connect(x, lambda h: (attend_source(h), None), 'cross_attention', token_mask, train)
    return self.feed_forward(x, token_mask, train)

  def __call__(self, x, encoded, token_mask, self_mask, cross_mask, positions, train: bool = False):
    """Teacher-forced pass. x [B, T, D]; encoded [B, S, D]; token_mask [B, T];
    self_mask [B, 1, T, T]; cross_mask [B, 1, T, S]; positions [B, T]."""
    attend = lambda h: (self.self_attention(h, self_mask, positions, deterministic=not train), None)
    x, _ = self.connect(x, attend, 'self_attention', token_mask, train)
    cross_kv = self.cross_attention.project_kv(encoded)
    attend_source = lambda h: self.cross_attention.cross(h, cross_kv, cross_mask,
                                                          deterministic=not train)
    return self._cross_and_ffn(x, attend_source, token_mask, train)

  def decode_step(self, x, self_cache: Cache, source_cache: Cache, cross_mask, self_mask,
                  position_index):
    """One token per hypothesis x [B, K, D] at `position_index`. Returns (x, new self cache).

    A sentence's K hypotheses are the K queries of its row: of its self-attention cache, read
    under `self_mask` [B, 1, K, C*K] (`masks.hypothesis_history_mask`), and of its source_cache
    (`project_source_cache`) under cross_mask [B, 1, 1, S].
    """
    attend = lambda h: self.self_attention.decode_step(h, self_cache, position_index, self_mask)
    x, self_cache = self.connect(x, attend, 'self_attention', None, False)
    attend_source = lambda h: self.cross_attention.cross_step(h, source_cache, cross_mask)
    return self._cross_and_ffn(x, attend_source, None, False), self_cache

  def empty_self_cache(self, batch_size: int, beam_size: int, length: int) -> Cache:
    return self.self_attention.empty_cache(batch_size, beam_size, length)
