"""The validated, frozen model configuration built once from `config.model`.

Building a `ModelConfig` checks every name and number, so a typo in an override fails in
milliseconds with a message naming the field, not after minutes of compilation.
"""

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from model import attention, blocks, feedforward, norms, position
from model.choices import lookup

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}

KERNEL_INITS = {
    # fairseq's choice for every projection (Glorot & Bengio 2010).
    'xavier_uniform': nn.initializers.xavier_uniform(),
    'lecun_normal': nn.initializers.lecun_normal(),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Field meanings: see configs/base.py; vocabulary sizes come from the tokenizer."""
  source_vocab_size: int
  target_vocab_size: int
  d_model: int
  num_heads: int
  d_ff: int
  num_encoder_layers: int
  num_decoder_layers: int
  dropout_rate: float
  attention_dropout_rate: float
  norm: str
  norm_position: str
  norm_epsilon: float
  position: str
  max_position: int
  activation: str
  residual: bool
  share_embeddings: bool
  tie_output_embedding: bool
  attention_impl: str
  dtype: str
  kernel_init: str

  def __post_init__(self):
    lookup(norms.NORMS, self.norm, 'config.model.norm')
    lookup(blocks.PLACEMENTS, self.norm_position, 'config.model.norm_position')
    lookup(position.POSITIONS, self.position, 'config.model.position')
    lookup(feedforward.FEEDFORWARDS, self.activation, 'config.model.activation')
    lookup(attention.ATTENTION_IMPLS, self.attention_impl, 'config.model.attention_impl')
    lookup(DTYPES, self.dtype, 'config.model.dtype')
    lookup(KERNEL_INITS, self.kernel_init, 'config.model.kernel_init')
    for name in ('source_vocab_size', 'target_vocab_size', 'd_model', 'num_heads', 'd_ff',
                 'num_encoder_layers', 'num_decoder_layers', 'max_position'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'config.model.{name}={value!r} must be a positive integer')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'config.model.{name}={getattr(self, name)!r} must be in [0, 1)')
    if self.d_model % self.num_heads:
      raise ValueError(f'config.model.d_model={self.d_model} must be divisible by '
                       f'config.model.num_heads={self.num_heads}')
    if self.position in position.ROTARY and (self.d_model // self.num_heads) % 2:
      raise ValueError(f'config.model.position={self.position!r} needs an even head dim, '
                       f'got d_model/num_heads={self.d_model // self.num_heads}')
    if self.position == 'sinusoidal' and self.d_model % 2:
      raise ValueError(f'config.model.position=sinusoidal needs an even d_model, got {self.d_model}')
    if self.share_embeddings and self.source_vocab_size != self.target_vocab_size:
      raise ValueError('config.model.share_embeddings=True needs one joint vocabulary, got '
                       f'{self.source_vocab_size} source and {self.target_vocab_size} target tokens')
    if self.attention_impl != 'xla' and self.attention_dropout_rate:
      raise ValueError(f'config.model.attention_impl={self.attention_impl!r} has no attention '
                       'dropout: set config.model.attention_dropout_rate=0 or attention_impl=xla')

  @classmethod
  def from_config(cls, model_config: ml_collections.ConfigDict, *, source_vocab_size: int,
                  target_vocab_size: int) -> 'ModelConfig':
    """Builds and validates; an unknown or missing key in `model_config` is an error."""
    fields = {f.name for f in dataclasses.fields(cls)} - {'source_vocab_size', 'target_vocab_size'}
    given = set(model_config.keys())
    if given - fields:
      raise ValueError(f'unknown config.model keys: {", ".join(sorted(given - fields))}; '
                       f'valid: {", ".join(sorted(fields))}')
    if fields - given:
      raise ValueError(f'config.model lacks keys: {", ".join(sorted(fields - given))}')
    return cls(source_vocab_size=source_vocab_size, target_vocab_size=target_vocab_size,
               **model_config.to_dict())

  @property
  def compute_dtype(self) -> Any:
    return DTYPES[self.dtype]

  @property
  def initializer(self) -> Callable:
    return KERNEL_INITS[self.kernel_init]
