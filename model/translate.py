"""Translation with the Transformer's decoding cache: greedy or beam search, jit-compiled.

Dimensions: B batch, S source length, K beam, T generated length.
"""

import functools

import jax

from model import decoding, masks
from model.transformer import Transformer


def _search_inputs(model: Transformer, variables, encoder_input_tokens, beam_size: int,
                   max_length_a, max_length_b):
  """Step function, cache and length limits that both searches start from.

  The encoder runs once and the cross-attention keys/values are projected once per source
  batch, into the source cache the step function reads; only the self-attention cache goes
  through the search (beam search reorders its hypotheses' histories, not its keys and values).

  Returns:
    (step_fn, cache, source_cache, max_length, max_lengths): the model's `decode_step` over
    `variables`, the empty cache (`Transformer.init_cache`), the [B]-leading source cache (the
    searches' context), the static output length T and the per-sentence limits int32 [B].
  """
  batch_size, source_length = encoder_input_tokens.shape
  max_length = decoding.decode_length_limit(source_length, max_length_a, max_length_b)
  source_lengths = masks.token_mask(encoder_input_tokens).sum(-1)  # [B]
  max_lengths = decoding.decode_length_limit(source_lengths, max_length_a, max_length_b)  # [B]
  encoded = model.apply(variables, encoder_input_tokens, method=Transformer.encode)  # [B, S, D]
  source_cache = model.apply(variables, encoded, encoder_input_tokens, method=Transformer.source_cache)
  cache = model.apply(variables, batch_size, beam_size, max_length, method=Transformer.init_cache)

  def step_fn(tokens, cache, position, source_cache):
    return model.apply(variables, tokens, cache, position, source_cache, method=Transformer.decode_step)

  return step_fn, cache, source_cache, max_length, max_lengths


# The length penalty is traced, not static: comparing penalties reuses one compilation.
@functools.partial(jax.jit, static_argnames=('model', 'beam_size', 'length_penalty_form',
                                              'early_stopping', 'max_length_a', 'max_length_b',
                                              'smallest_batch'))
def translate(model: Transformer, variables, encoder_input_tokens, *, beam_size: int = 1,
              length_penalty: float = 1.0, length_penalty_form: str = 'fairseq',
              early_stopping: bool = False, max_length_a: int = 10, max_length_b: float = 1.2,
              smallest_batch: int = 8):
  """Best hypothesis per source sentence.

  Each sentence may generate at most a + b * (its source length) tokens.

  Args:
    model: the Transformer (static).
    variables: {'params': ..., ['batch_stats': ...]}.
    encoder_input_tokens: [B, S] int32, EOS-terminated and 0-padded.
    beam_size: 1 for greedy search.
    length_penalty: alpha of the length normalisation (beam search only).
    length_penalty_form: 'fairseq' (score / len^alpha) or 'gnmt'.
    early_stopping: beam search stops a sentence at its K-th finished hypothesis (fairseq's
      rule) instead of when no alive one can beat it (exact).
    max_length_a: a, tokens allowed whatever the source length.
    max_length_b: b, tokens allowed per source token.
    smallest_batch: beam search drops finished sentences from the batch in halvings down to this
      many sentences (`decoding.beam_search`); the batch size or more compiles one search loop
      instead of one per halving.

  Returns:
    [B, T] int32 tokens, EOS-terminated (unless cut at the limit) and 0-padded.
  """
  if beam_size == 1:
    step_fn, cache, source_cache, max_length, max_lengths = _search_inputs(
        model, variables, encoder_input_tokens, 1, max_length_a, max_length_b)
    return decoding.greedy_search(step_fn, cache, batch_size=encoder_input_tokens.shape[0],
                                  max_length=max_length, context=source_cache,
                                  max_lengths=max_lengths)
  tokens, _ = beam_translate(
      model, variables, encoder_input_tokens, beam_size=beam_size, length_penalty=length_penalty,
      length_penalty_form=length_penalty_form, early_stopping=early_stopping,
      max_length_a=max_length_a, max_length_b=max_length_b, smallest_batch=smallest_batch)
  return tokens[:, 0]


@functools.partial(jax.jit, static_argnames=('model', 'beam_size', 'length_penalty_form',
                                              'early_stopping', 'max_length_a', 'max_length_b',
                                              'smallest_batch'))
def beam_translate(model: Transformer, variables, encoder_input_tokens, *, beam_size: int,
                   length_penalty: float = 1.0, length_penalty_form: str = 'fairseq',
                   early_stopping: bool = False, max_length_a: int = 10,
                   max_length_b: float = 1.2, smallest_batch: int = 8):
  """The `beam_size` best hypotheses per source sentence, by beam search whatever the beam size.

  Arguments as for `translate`; beam_size 1 runs beam search with one beam (which `translate`
  replaces by greedy search), so the two can be checked against each other.

  Returns:
    tokens: [B, K, T] int32, best first, EOS-terminated (unless cut at the limit) and 0-padded.
    scores: [B, K] float32 length-penalised log-probabilities.
  """
  step_fn, cache, source_cache, max_length, max_lengths = _search_inputs(
      model, variables, encoder_input_tokens, beam_size, max_length_a, max_length_b)
  return decoding.beam_search(
      step_fn, cache, batch_size=encoder_input_tokens.shape[0], beam_size=beam_size,
      max_length=max_length, context=source_cache, max_lengths=max_lengths,
      length_penalty=length_penalty, length_penalty_form=length_penalty_form,
      early_stopping=early_stopping, smallest_batch=smallest_batch)
