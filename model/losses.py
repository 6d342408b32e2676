"""Label-smoothed cross entropy over the target vocabulary, in float32.

Dimensions: B batch, T target length, V vocabulary.

The smoothed target puts 1 - a on the reference token and a / V on every token (optax's
`smooth_labels`), so the loss is (1 - a) * NLL + a * mean_v(-log p_v). Written in that closed
form it needs no [B, T, V] one-hot; tests check it against optax's one-hot formulation.

Training computes the same sums from the output layer's input as well (`output_layer_sums`): the
logits then feed only the normaliser, which `chunked_output_layer_sums` computes a chunk of tokens
at a time so that the [B, T, V] logits never exist whole.
"""

import jax
import jax.numpy as jnp


def token_losses(logits, targets, label_smoothing: float = 0.0):
  """Per-token smoothed loss and plain negative log-likelihood.

  Args:
    logits: [B, T, V] (cast to float32).
    targets: [B, T] int token ids.
    label_smoothing: a in [0, 1).

  Returns:
    (loss [B, T], nll [B, T]), both float32.
  """
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  # A one-hot product rather than a gather: its gradient fuses into the softmax gradient's one
  # elementwise pass over [B, T, V], where a gather's would be a scatter into a fresh copy.
  is_target = jnp.arange(logits.shape[-1]) == targets[..., None]  # [B, T, V]
  target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)  # [B, T]
  return _smoothed(log_z, target_logit, lambda: logits.mean(-1), label_smoothing)


def _smoothed(log_z, target_logit, mean_logit, label_smoothing: float):
  """(loss, nll) [B, T] from log Z, the target's logit and a thunk of the mean logit over the
  vocabulary (evaluated only with smoothing): (1 - a) * NLL + a * mean_v(-log p_v)."""
  nll = log_z - target_logit
  if not label_smoothing:
    return nll, nll
  uniform_nll = log_z - mean_logit()  # [B, T]: mean over v of -log p_v
  return (1.0 - label_smoothing) * nll + label_smoothing * uniform_nll, nll


def weighted_sums(logits, targets, weights, label_smoothing: float = 0.0) -> dict[str, jnp.ndarray]:
  """Sums over real target tokens, so several batches or devices can be combined exactly.

  Args:
    logits: [B, T, V].
    targets: [B, T].
    weights: [B, T], 1 at real target tokens and 0 at padding.
    label_smoothing: a in [0, 1).

  Returns:
    {'loss': sum of smoothed losses, 'nll': sum of NLL, 'tokens': sum of weights, 'correct':
    count of argmax hits}; the training loss is loss / tokens.
  """
  weights = weights.astype(jnp.float32)
  loss, nll = token_losses(logits, targets, label_smoothing)
  correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(),
          'tokens': weights.sum(), 'correct': (correct * weights).sum()}


def output_layer_sums(logits, hidden, table, targets, weights, label_smoothing: float = 0.0
                      ) -> dict[str, jnp.ndarray]:
  """weighted_sums' 'loss', 'nll' and 'tokens' for logits = hidden . table^T, with only the
  normaliser log Z read from the [B, T, V] logits.

  The target logit is hidden . table[target] and the mean logit hidden . mean_v(table[v]): [B, T, D]
  work where `token_losses` makes two more passes over [B, T, V] (a select and a mean), and in the
  backward pass the logits' gradient is softmax times one [B, T] factor, a single elementwise pass.
  On the 2-core CPU the output layer and loss of a tiny-model slice, timed alone, took ~37% less
  time this way; a whole training step a few percent at most (docs/performance.md). Equal to
  `weighted_sums` up to float32 rounding (tests/test_transformer.py).

  Args:
    logits: [B, T, V], the product of `hidden` and `table` (cast to float32).
    hidden: [B, T, D], the output layer's input.
    table: [V, D], the output layer's weights (the tied embedding, or the untied kernel transposed).
    targets: [B, T].
    weights: [B, T], 1 at real target tokens and 0 at padding.
    label_smoothing: a in [0, 1).
  """
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)  # [B, T]
  return _sums_from_log_z(log_z, hidden, table, targets, weights, label_smoothing)


def chunked_output_layer_sums(hidden, table, targets, weights, label_smoothing: float = 0.0, *,
                              chunk_tokens: int) -> dict[str, jnp.ndarray]:
  """`output_layer_sums` without the [B, T, V] logits: log Z over chunks of `chunk_tokens` tokens.

  Each chunk's [C, V] float32 logits exist only inside its own iteration of a loop, and the
  backward pass recomputes them (jax.checkpoint) rather than keeping them, so the step holds
  [C, V] of logits and their gradient where the plain loss holds [B*T, V] of each: at the
  IWSLT-size recipe's 32k tokens and vocabulary 10,000 that is 1.3 GB each in float32. The price
  is a second output-layer product in the backward pass. Equal to `output_layer_sums` up to
  float32 rounding (tests/test_transformer.py).

  Args:
    hidden: [B, T, D], the output layer's input.
    table: [V, D], the output layer's weights.
    targets, weights, label_smoothing: as `output_layer_sums`.
    chunk_tokens: tokens per chunk (rows of B*T); the last chunk is padded.
  """
  if chunk_tokens <= 0:
    raise ValueError(f'chunked_output_layer_sums: chunk_tokens={chunk_tokens} must be positive')
  flat = hidden.reshape(-1, hidden.shape[-1])  # [N, D]
  tokens = flat.shape[0]
  chunks = -(-tokens // chunk_tokens)
  flat = jnp.pad(flat, [(0, chunks * chunk_tokens - tokens), (0, 0)])
  flat = flat.reshape(chunks, chunk_tokens, flat.shape[-1])  # [chunks, C, D]

  @jax.checkpoint
  def chunk_log_z(chunk):  # [C, D] -> [C]
    logits = jnp.einsum('CD,VD->CV', chunk, table.astype(chunk.dtype),
                        preferred_element_type=jnp.float32)  # [C, V]
    return jax.nn.logsumexp(logits, axis=-1)

  log_z = jax.lax.map(chunk_log_z, flat).reshape(-1)[:tokens].reshape(hidden.shape[:-1])  # [B, T]
  return _sums_from_log_z(log_z, hidden, table, targets, weights, label_smoothing)


def _sums_from_log_z(log_z, hidden, table, targets, weights, label_smoothing: float
                     ) -> dict[str, jnp.ndarray]:
  """The sums of `output_layer_sums` from log Z [B, T]: the target and mean logits from
  `hidden` [B, T, D] and `table` [V, D]."""
  weights = weights.astype(jnp.float32)
  target_rows = jnp.take(table, targets, axis=0).astype(hidden.dtype)  # [B, T, D]
  target_logit = jnp.einsum('...D,...D->...', hidden, target_rows,
                            preferred_element_type=jnp.float32)  # [B, T]
  mean_logit = lambda: jnp.einsum('...D,D->...', hidden, table.mean(0).astype(hidden.dtype),
                                  preferred_element_type=jnp.float32)  # [B, T]
  loss, nll = _smoothed(log_z, target_logit, mean_logit, label_smoothing)
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(), 'tokens': weights.sum()}
