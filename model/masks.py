"""Attention masks as pure functions. True means "may attend".

Dimensions: B batch, S source (key) length, T target (query) length.
All masks broadcast against attention logits shaped [B, N, T, S] (N heads).
"""

import jax.numpy as jnp

from model.special_tokens import PAD_ID


def token_mask(tokens: jnp.ndarray, pad_id: int = PAD_ID) -> jnp.ndarray:
  """[B, L] bool: True at real tokens, False at padding."""
  return tokens != pad_id


def padding_mask(query_mask: jnp.ndarray, key_mask: jnp.ndarray) -> jnp.ndarray:
  """Queries attend only to real keys; padded queries attend to nothing.

  >>> padding_mask(jnp.array([[1, 1, 0]]), jnp.array([[1, 0]]))[0, 0].astype(int)
  [[1, 0], [1, 0], [0, 0]]

  Args:
    query_mask: [B, T] bool.
    key_mask: [B, S] bool.

  Returns:
    [B, 1, T, S] bool.
  """
  return query_mask[:, None, :, None] & key_mask[:, None, None, :]


def segment_mask(query_segments: jnp.ndarray, key_segments: jnp.ndarray) -> jnp.ndarray:
  """Packed rows: a query attends only to real keys of its own pair (segment).

  Segment ids number the pairs of a row 1, 2, ...; 0 is padding. Rows of one pair each
  (segments = token_mask) give exactly `padding_mask`.

  >>> segment_mask(jnp.array([[1, 1, 2, 0]]), jnp.array([[1, 2, 2]]))[0, 0].astype(int)
  [[1, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0]]

  Args:
    query_segments: [B, T] int.
    key_segments: [B, S] int.

  Returns:
    [B, 1, T, S] bool.
  """
  same = query_segments[:, None, :, None] == key_segments[:, None, None, :]
  return same & padding_mask(query_segments != 0, key_segments != 0)


def causal_mask(length: int) -> jnp.ndarray:
  """[1, 1, T, T] bool, lower triangular: position t sees positions <= t.

  >>> causal_mask(3)[0, 0].astype(int)
  [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
  """
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def decoder_self_mask(target_segments: jnp.ndarray) -> jnp.ndarray:
  """Causal mask of decoder self-attention within each pair: [B, 1, T, T] bool.

  Args:
    target_segments: [B, T] int segment ids, 0 at padding (a bool token mask for one pair per row).
  """
  return segment_mask(target_segments, target_segments) & causal_mask(target_segments.shape[1])


def hypothesis_history_mask(history: jnp.ndarray, position: jnp.ndarray) -> jnp.ndarray:
  """Mask of one incremental decoding step over a sentence's shared self-attention cache.

  The cache row of a sentence holds, in each slot c < position, the keys of its K hypotheses
  of that step; the query of hypothesis q at `position` sees slot c of the hypothesis its own
  prefix went through there, history[q, c], for every c <= position, which is what the causal
  mask allows in the full pass.

  Args:
    history: int32 [B, K, C], which of the sentence's K cache columns holds each hypothesis's
      slot c (history[:, q, position] = q: the token fed now).
    position: int32 scalar, the index of the token being fed.

  Returns:
    [B, 1, K, C*K] bool, entry c * K + k for slot c of column k.
  """
  batch, beams, slots = history.shape
  mask = ((history[..., None] == jnp.arange(beams))  # [B, K, C, K]
          & (jnp.arange(slots) <= position)[:, None])
  return mask.reshape(batch, 1, beams, slots * beams)
