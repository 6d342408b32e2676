"""The encoder-decoder Transformer for translation.

Dimensions: B batch, S source length, T target length, D model width, V vocabulary,
C decoding cache slots, K hypotheses per sentence, R = B * K decoding rows.

Entry points (all pure: parameters and caches go in and come out):
  __call__(encoder_input_tokens, decoder_input_tokens, train, **packing) -> logits [B, T, V] (float32)
    (with_output_layer_input: (logits, hidden [B, T, D], output table [V, D]), for
    losses.output_layer_sums)
  encode(encoder_input_tokens, train, segment_ids, positions) -> encoded [B, S, D]
  decode(encoded, encoder_input_tokens, decoder_input_tokens, train, **packing) -> logits [B, T, V]
  source_cache(encoded, encoder_input_tokens) -> source_cache
  init_cache(batch_size, beam_size, max_decode_length) -> cache
  decode_step(tokens [R], cache, position_index, source_cache) -> (logits [R, V], cache)
Token id 0 is padding everywhere.

Packed rows (data.pack_length) hold several pairs each. Their batches add the features
  encoder_segment_ids, decoder_segment_ids  [B, S], [B, T] int: pair 1, 2, ... of the row, 0 at padding
  encoder_positions, decoder_positions      [B, S], [B, T] int: positions restarting at 0 in each pair
and attention stays within a pair (masks.segment_mask), so every pair's logits are those it would
get in a row of its own. Without them a row is one right-padded pair.

Decoding keeps two pytrees apart:
  source_cache {'encoder_mask': [B, S] bool, 'layers': [{'key' [B, N, H, S], 'value' [B, N, S, H]}, ...]}:
    each decoder layer's cross-attention keys/values, one row per sentence, computed once and
    only read afterwards;
  cache, a decoding.SearchCache:
    hypotheses {'history': [R, C] int}: for each hypothesis (R = B * K, a sentence's K hypotheses
      adjacent; K = 1 greedy), which of its sentence's K cache columns holds its slot c;
    sentences [{'key' [B, N, H, C*K], 'value' [B, N, C*K, H]}, ...]: each decoder layer's
      self-attention keys/values, one row per sentence, entry c * K + k (slot c of column k)
      written by the hypothesis in row k at step c.
Beam search reorders only `history` (ints); keys and values stay where they were written, and a
sentence's K hypotheses attend as K queries of its row, to their own histories (as they do to the
source rows in cross-attention), so neither cache is ever copied.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from model import decoding, masks, products
from model.blocks import PLACEMENTS, DecoderLayer, EncoderLayer
from model.config import ModelConfig
from model.dropout import Dropout
from model.norms import NORMS
from model.position import POSITIONS


def _logits(x, embedding):
  """x [..., D] times the embedding table [V, D] transposed: float32 logits [..., V]."""
  return jnp.einsum('...D,VD->...V', x, embedding.astype(x.dtype), preferred_element_type=jnp.float32)


# _logits with its gradient written out, so the table's gradient is computed as x^T g ([D, V], both
# operands in their natural layout) and then transposed (V x D values). Left to autodiff, XLA
# computes g^T x directly, which first copies the [..., V] logit gradient into transposed layout:
# on CPU that copy took ~25% of the output layer's time.
tied_logits = jax.custom_vjp(_logits)


def _tied_logits_forward(x, embedding):
  # _logits, not tied_logits: forward-mode differentiation of the gradient (Hessian-vector
  # products, scripts/hessian.py) cannot pass a custom_vjp call.
  return _logits(x, embedding), (x, embedding)


def _tied_logits_backward(residuals, logits_grad):
  x, embedding = residuals
  logits_grad = logits_grad.astype(x.dtype)  # [..., V]
  x_grad = jnp.einsum('...V,VD->...D', logits_grad, embedding.astype(x.dtype),
                      preferred_element_type=jnp.float32).astype(x.dtype)
  flat_x = x.reshape(-1, x.shape[-1])  # [N, D]
  flat_grad = logits_grad.reshape(-1, logits_grad.shape[-1])  # [N, V]
  kernel_grad = jnp.dot(products.transposed_copy(flat_x), flat_grad,
                        preferred_element_type=jnp.float32)  # [D, V]
  # The barrier keeps XLA from folding the transpose back into the product.
  kernel_grad = jax.lax.optimization_barrier(kernel_grad)  # [D, V]
  return x_grad, kernel_grad.T.astype(embedding.dtype)  # [V, D]


tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)


def _segments_and_positions(tokens, segment_ids, positions):
  """A packed row's features as given, else those of one right-padded pair per row: [B, L] each."""
  if segment_ids is None:
    segment_ids = masks.token_mask(tokens).astype(jnp.int32)
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  return segment_ids, positions


class Transformer(nn.Module):
  config: ModelConfig

  @classmethod
  def of(cls, model_config: ml_collections.ConfigDict, vocab_size: int,
         target_vocab_size: int | None = None) -> 'Transformer':
    """The model of `config.model` for `vocab_size` source tokens and `target_vocab_size` target
    tokens (by default the same: a joint vocabulary)."""
    return cls(ModelConfig.from_config(
        model_config, source_vocab_size=vocab_size,
        target_vocab_size=vocab_size if target_vocab_size is None else target_vocab_size))

  def setup(self):
    cfg = self.config
    embed = lambda vocab, name: nn.Embed(
        vocab, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
        embedding_init=nn.initializers.normal(stddev=cfg.d_model ** -0.5), name=name)
    self.source_embedding = embed(cfg.source_vocab_size, 'source_embedding')
    if not cfg.share_embeddings:
      self.separate_target_embedding = embed(cfg.target_vocab_size, 'target_embedding')
    self.encoder_positions = POSITIONS[cfg.position](cfg.max_position, name='encoder_positions')
    self.decoder_positions = POSITIONS[cfg.position](cfg.max_position, name='decoder_positions')
    self.encoder_layers = [EncoderLayer(cfg, name=f'encoder_layer_{i}')
                           for i in range(cfg.num_encoder_layers)]
    self.decoder_layers = [DecoderLayer(cfg, name=f'decoder_layer_{i}')
                           for i in range(cfg.num_decoder_layers)]
    if PLACEMENTS[cfg.norm_position].final_norm:
      self.encoder_final_norm = NORMS[cfg.norm](epsilon=cfg.norm_epsilon, name='encoder_final_norm')
      self.decoder_final_norm = NORMS[cfg.norm](epsilon=cfg.norm_epsilon, name='decoder_final_norm')
    if not cfg.tie_output_embedding:
      self.output_kernel = self.param('output_kernel', cfg.initializer,
                                      (cfg.d_model, cfg.target_vocab_size))  # [D, V]
    self.dropout = Dropout(cfg.dropout_rate)

  def _target_embedding(self) -> nn.Embed:
    return self.source_embedding if self.config.share_embeddings else self.separate_target_embedding

  def _embed(self, embedding, add_positions, tokens, positions, train):
    # sqrt(D) scaling makes embeddings (std D^-0.5 at init) unit-variance, like Vaswani et al.
    x = embedding(tokens) * jnp.asarray(self.config.d_model ** 0.5, self.config.compute_dtype)  # [B, L, D]
    return self.dropout(add_positions(x, positions), deterministic=not train)

  def _final_norm(self, norm_name, x, token_mask, train):
    if PLACEMENTS[self.config.norm_position].final_norm:
      return getattr(self, norm_name)(x, token_mask, train)
    return x

  def _logits(self, x) -> jnp.ndarray:
    """Output projection with float32 accumulation and result [..., V] (for a stable softmax)."""
    if self.config.tie_output_embedding:
      return tied_logits(x, self._target_embedding().embedding)
    return jnp.einsum('...D,DV->...V', x, self.output_kernel.astype(x.dtype),
                      preferred_element_type=jnp.float32)

  def _output_table(self) -> jnp.ndarray:
    """The output layer's weights as [V, D]: token v's logit is x . table[v]."""
    if self.config.tie_output_embedding:
      return self._target_embedding().embedding
    return self.output_kernel.T

  def encode(self, encoder_input_tokens, *, train: bool = False, segment_ids=None, positions=None):
    """[B, S] tokens (and, for packed rows, their segment ids and positions) -> [B, S, D]."""
    token_mask = masks.token_mask(encoder_input_tokens)  # [B, S]
    segment_ids, positions = _segments_and_positions(encoder_input_tokens, segment_ids, positions)
    attention_mask = masks.segment_mask(segment_ids, segment_ids)  # [B, 1, S, S]
    x = self._embed(self.source_embedding, self.encoder_positions, encoder_input_tokens, positions, train)
    for layer in self.encoder_layers:
      x = layer(x, token_mask, attention_mask, positions, train)
    return self._final_norm('encoder_final_norm', x, token_mask, train)

  def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, *, train: bool = False,
             encoder_segment_ids=None, decoder_segment_ids=None, decoder_positions=None,
             with_output_layer_input: bool = False):
    """Teacher-forced decoder: [B, T] right-shifted targets -> [B, T, V] float32 logits.

    With `with_output_layer_input`, returns (logits, hidden [B, T, D], table [V, D]): the output
    layer's input and weights as well, from which training computes its loss
    (losses.output_layer_sums).
    """
    target_mask = masks.token_mask(decoder_input_tokens)  # [B, T]
    decoder_segment_ids, positions = _segments_and_positions(
        decoder_input_tokens, decoder_segment_ids, decoder_positions)
    encoder_segment_ids, _ = _segments_and_positions(encoder_input_tokens, encoder_segment_ids, None)
    self_mask = masks.decoder_self_mask(decoder_segment_ids)  # [B, 1, T, T]
    cross_mask = masks.segment_mask(decoder_segment_ids, encoder_segment_ids)  # [B, 1, T, S]
    x = self._embed(self._target_embedding(), self.decoder_positions, decoder_input_tokens, positions, train)
    for layer in self.decoder_layers:
      x = layer(x, encoded, target_mask, self_mask, cross_mask, positions, train)
    hidden = self._final_norm('decoder_final_norm', x, target_mask, train)
    if with_output_layer_input:
      return self._logits(hidden), hidden, self._output_table()
    return self._logits(hidden)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, *, train: bool = False,
               encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
               decoder_positions=None, with_output_layer_input: bool = False):
    encoded = self.encode(encoder_input_tokens, train=train, segment_ids=encoder_segment_ids,
                          positions=encoder_positions)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, train=train,
                       encoder_segment_ids=encoder_segment_ids,
                       decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
                       with_output_layer_input=with_output_layer_input)

  def source_cache(self, encoded, encoder_input_tokens):
    """What decoding reads of one source batch: its mask and every layer's cross-attention keys
    and values, [B]-leading and computed once."""
    return {'encoder_mask': masks.token_mask(encoder_input_tokens),  # [B, S]
            'layers': [layer.project_source_cache(encoded) for layer in self.decoder_layers]}

  def init_cache(self, batch_size: int, beam_size: int, max_decode_length: int) -> decoding.SearchCache:
    """Empty decoding cache of `beam_size` hypotheses for each of `batch_size` sentences, with
    `max_decode_length` slots each (see the module docstring)."""
    rows = batch_size * beam_size
    return decoding.SearchCache(
        hypotheses={'history': jnp.zeros((rows, max_decode_length), jnp.int32)},  # [R, C]
        sentences=[layer.empty_self_cache(batch_size, beam_size, max_decode_length)
                   for layer in self.decoder_layers])

  def decode_step(self, tokens, cache: decoding.SearchCache, position_index, source_cache):
    """Feeds tokens [R] at `position_index` (0 for BOS); returns logits [R, V] and the new cache.

    R is a multiple of the source batch B: rows b*K .. b*K+K-1 continue sentence b.
    """
    batch = source_cache['encoder_mask'].shape[0]
    rows = tokens.shape[0]
    beams = rows // batch
    # The token fed now is each hypothesis's own: its keys go to its own column of the slot.
    history = cache.hypotheses['history'].at[:, position_index].set(jnp.arange(rows) % beams)  # [R, C]
    self_mask = masks.hypothesis_history_mask(history.reshape(batch, beams, -1), position_index)
    positions = jnp.full((batch, beams), position_index, dtype=jnp.int32)  # [B, K]
    x = self._embed(self._target_embedding(), self.decoder_positions,
                    tokens.reshape(batch, beams), positions, False)  # [B, K, D]
    cross_mask = source_cache['encoder_mask'][:, None, None, :]  # [B, 1, 1, S]
    new_cache = []
    for layer, layer_cache, layer_source in zip(self.decoder_layers, cache.sentences,
                                                source_cache['layers']):
      x, layer_cache = layer.decode_step(x, layer_cache, layer_source, cross_mask, self_mask,
                                         position_index)
      new_cache.append(layer_cache)
    x = self._final_norm('decoder_final_norm', x, None, False)
    logits = self._logits(x.reshape(rows, -1))  # [R, V]
    return logits, decoding.SearchCache({'history': history}, new_cache)
