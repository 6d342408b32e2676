"""Greedy and beam search over an explicit decoding cache.

The searches see the model only through a step function,

  step_fn(tokens, cache, position, context) -> (logits, new_cache)

which feeds one token per row (`tokens` int32 [N], `position` the int32 index of
the fed token, 0 for BOS) and returns float32 next-token logits [N, V]. The cache
is any pytree whose leaves all have leading dimension N, or a `SearchCache` whose
`hypotheses` have leading dimension N and whose `sentences` have B (state that
step_fn writes per sentence, which beam search never reorders); the context (the
source, read only) any pytree whose leaves have leading dimension B, or None.
The searches are `jax.lax.while_loop`s that exit as soon as every sentence is
finished, so a whole search compiles under
`jax.jit(functools.partial(beam_search, step_fn, ...))`.

Lengths count generated tokens, EOS included and BOS excluded. `max_length` is the
static output size: a hypothesis still alive after `max_length` tokens ends there
without EOS and competes with the rest, scored at that length. The optional
per-sentence `max_lengths` (a + b * source length, `decode_length_limit`) force EOS
at each sentence's own limit instead. Output positions after EOS hold `pad_id`.

Dimensions:
  B: batch (sentences)
  K: beam size
  N: rows fed to step_fn (B for greedy search, B*K for beam search)
  T: target length (max_length)
  V: vocabulary
"""

import dataclasses
import functools
import numbers
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp

from model.special_tokens import BOS_ID, EOS_ID, PAD_ID
from model.top_k import top_k_by_blocks

_LENGTH_PENALTIES = {
    # fairseq: score / length**alpha.
    'fairseq': lambda length, alpha: length**alpha,
    # GNMT (Wu et al. 2016): score / ((5 + length) / 6)**alpha.
    'gnmt': lambda length, alpha: ((5.0 + length) / 6.0)**alpha,
}


def decode_length_limit(source_length, a=10, b=1.2):
  """Most tokens to generate for a source: `a + b * source_length`, rounded down.

  Args:
    source_length: a Python int (e.g. the longest source, for the static
      `max_length`) or an int array [B] (for per-sentence `max_lengths`).
    a: tokens allowed whatever the source length.
    b: tokens allowed per source token.

  Returns:
    An int for an int input, else int32 [B].
  """
  if isinstance(source_length, numbers.Integral):
    return int(a + b * source_length)
  source_length = jnp.asarray(source_length, jnp.float32)
  return jnp.floor(a + b * source_length).astype(jnp.int32)


def tile_beams(tree, beam_size):
  """Repeats every leaf for the beams, each sentence's K copies adjacent.

  Args:
    tree: pytree of arrays with leading dimension B (e.g. the decoding cache).
    beam_size: K.

  Returns:
    The pytree with every leaf [B, ...] -> [B*K, ...].
  """
  return jax.tree.map(lambda x: jnp.repeat(x, beam_size, axis=0), tree)


class SearchCache(NamedTuple):
  """A decoding cache in two parts, for state a sentence's hypotheses share.

  hypotheses: pytree of [N]-leading arrays, one row per hypothesis; beam search
    reorders them as beams are re-ranked.
  sentences: pytree of [B]-leading arrays, one row per sentence, that step_fn
    writes; beam search never reorders them (a self-attention cache that holds
    every hypothesis's keys in its sentence's row, `Transformer.init_cache`), and
    drops them with their sentence.
  """
  hypotheses: Any
  sentences: Any


def _take_cache(cache, rows, sentences=None):
  """The cache's hypothesis rows `rows` and, when given, its sentence rows `sentences` (the
  sentence leaves of a `SearchCache` stay in place otherwise: re-ranking keeps every sentence)."""
  if not isinstance(cache, SearchCache):
    return _take_rows(cache, rows)
  return SearchCache(_take_rows(cache.hypotheses, rows),
                     cache.sentences if sentences is None else _take_rows(cache.sentences, sentences))


def _eos_steps(max_lengths, batch_size, max_length):
  """Step at which each sentence must emit EOS, int32 [B].

  Without per-sentence limits it is `max_length`, a step the loop never reaches.
  """
  if max_lengths is None:
    return jnp.full((batch_size,), max_length, jnp.int32)
  return jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_length) - 1


def greedy_search(step_fn, cache, *, batch_size, max_length, context=None,
                  max_lengths=None, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID):
  """Decodes the most probable next token at every step.

  Args:
    step_fn: `(tokens [B], cache, position, context) -> (logits [B, V], cache)`.
    cache: pytree of arrays with leading dimension B, or a `SearchCache`.
    batch_size: B.
    max_length: T, most tokens generated (static int).
    context: pytree of arrays with leading dimension B that step_fn reads.
    max_lengths: optional int32 [B]; sentence b emits EOS at the latest as its
      `max_lengths[b]`-th token.
    bos_id: token fed first.
    eos_id: token that ends a sentence.
    pad_id: token written after EOS.

  Returns:
    int32 [B, T] generated tokens.
  """
  eos_steps = _eos_steps(max_lengths, batch_size, max_length)

  def cond(state):
    i, _, _, finished, _ = state
    return (i < max_length) & ~jnp.all(finished)

  def body(state):
    i, tokens, last, finished, cache = state
    logits, cache = step_fn(last, cache, i, context)
    next_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    next_tokens = jnp.where(i == eos_steps, eos_id, next_tokens)
    next_tokens = jnp.where(finished, pad_id, next_tokens)
    finished |= next_tokens == eos_id
    return i + 1, tokens.at[:, i].set(next_tokens), next_tokens, finished, cache

  init = (
      jnp.array(0, jnp.int32),
      jnp.full((batch_size, max_length), pad_id, jnp.int32),
      jnp.full((batch_size,), bos_id, jnp.int32),
      jnp.zeros((batch_size,), bool),
      cache,
  )
  return jax.lax.while_loop(cond, body, init)[1]


def _phase_sizes(batch_size: int, smallest_batch: int) -> list[int]:
  """Sentences per phase of a compacting search: B, B/2, B/4, ... while at least `smallest_batch`."""
  sizes = [batch_size]
  while sizes[-1] // 2 >= max(smallest_batch, 1):
    sizes.append(sizes[-1] // 2)
  return sizes


def _take_rows(tree, rows):
  """Every leaf's rows `rows` along axis 0."""
  # Indices are in bounds by construction: 'clip' spares the per-element check.
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0, mode='clip'), tree)


def _take_sentences(state: 'BeamState', keep, beam_size) -> 'BeamState':
  """The sentences `keep` [M] of a search state: [B]-leading leaves by sentence, the cache's
  [B*K]-leading leaves by each kept sentence's K rows."""
  rows = (keep[:, None] * beam_size + jnp.arange(beam_size)).reshape(-1)  # [M*K]
  by_sentence = {field.name: _take_rows(getattr(state, field.name), keep)
                 for field in dataclasses.fields(state) if field.name not in ('i', 'cache')}
  return state.replace(**by_sentence, cache=_take_cache(state.cache, rows, keep))


@flax.struct.dataclass
class BeamState:
  """`beam_search`'s loop state; n is the sentences in the current phase (B, B/2, ...)."""
  i: jax.Array  # int32 []: tokens generated so far
  alive_seqs: jax.Array  # int32 [n, K, T+1]: BOS, then the generated tokens
  alive_log_probs: jax.Array  # float32 [n, K]; -inf for a beam not yet started
  finished_seqs: jax.Array  # int32 [n, K, T+1]
  finished_scores: jax.Array  # float32 [n, K] penalised; -inf for an empty slot
  done: jax.Array  # bool [n]: the sentence's finished hypotheses are final
  eos_steps: jax.Array  # int32 [n]: the step at which EOS is forced
  longest: jax.Array  # int32 [n]: the most tokens a hypothesis can reach
  sentence: jax.Array  # int32 [n]: each row's index in the batch
  context: Any  # [n]-leading pytree that step_fn reads
  cache: Any  # [n*K]-leading pytree, or a SearchCache


@dataclasses.dataclass(frozen=True)
class _Ranking:
  """How hypotheses are ranked and when a sentence is done (static)."""
  beam_size: int
  max_length: int
  length_penalty: float
  penalty: Any  # (length, alpha) -> divisor
  early_stopping: bool
  eos_id: int

  def penalised(self, log_probs, length):
    return log_probs / self.penalty(jnp.asarray(length, jnp.float32), self.length_penalty)

  def is_done(self, state: BeamState):
    """[n] whether each sentence's K finished hypotheses are final."""
    best_alive = state.alive_log_probs[:, 0]
    # Log-probabilities only fall as tokens are added and the penalty is monotone in length, so
    # no extension of the best alive beam can score above its penalised score at the shortest or
    # the longest reachable length.
    bound = jnp.maximum(self.penalised(best_alive, state.i + 1),
                        self.penalised(best_alive, state.longest))
    done = bound <= state.finished_scores[:, -1]
    if self.early_stopping:
      done |= state.finished_scores[:, -1] > -jnp.inf  # K finished
    return done


def _extensions(state: BeamState, logits, ranking: _Ranking):
  """The 2K best one-token extensions of each sentence's alive beams.

  Returns (log-probabilities [n, 2K], their last tokens [n, 2K], their parent beams [n, 2K], the
  extended sequences [n, 2K, T+1]).
  """
  k, eos_id, i = ranking.beam_size, ranking.eos_id, state.i
  n, vocab = logits.shape[0], logits.shape[-1]
  normaliser = jax.nn.logsumexp(logits, axis=-1)  # [n, K]
  force_eos = (i == state.eos_steps)[:, None, None] & (jnp.arange(vocab) != eos_id)
  logits = jnp.where(force_eos, -jnp.inf, logits)
  # The 2K best extensions of a sentence are among the 2K best of each of its beams: ranking each
  # beam's vocabulary first and then K * 2K candidates gives the same ranking (ties too: lower
  # beam, then lower token, first) as one top-k over all K * V, without writing K * V
  # log-probabilities per sentence. On CPU that halved this part of the step.
  per_beam = min(2 * k, vocab)
  beam_top, beam_tokens = top_k_by_blocks(logits, per_beam)  # [n, K, 2K]
  candidates = (state.alive_log_probs - normaliser)[:, :, None] + beam_top
  # 2K candidates hold at least K that do not end in EOS (one EOS per beam).
  top_log_probs, top_ids = jax.lax.top_k(candidates.reshape(n, k * per_beam), 2 * k)  # [n, 2K]
  parents = top_ids // per_beam
  tokens = jnp.take_along_axis(beam_tokens.reshape(n, k * per_beam), top_ids, axis=1)
  top_seqs = jnp.take_along_axis(state.alive_seqs, parents[:, :, None], axis=1)
  top_seqs = top_seqs.at[:, :, i + 1].set(tokens)  # [n, 2K, T+1]
  return top_log_probs, tokens, parents, top_seqs


def _beam_step(state: BeamState, step_fn, ranking: _Ranking) -> BeamState:
  """One token more for every alive beam: the new alive and finished hypotheses."""
  k, i = ranking.beam_size, state.i
  n = state.alive_seqs.shape[0]
  fed = state.alive_seqs[:, :, i].reshape(n * k)  # [n, K] -> [n*K]
  logits, cache = step_fn(fed, state.cache, i, state.context)
  logits = logits.astype(jnp.float32).reshape(n, k, -1)  # [n*K, V] -> [n, K, V]
  top_log_probs, tokens, parents, top_seqs = _extensions(state, logits, ranking)

  # An EOS extension (or any at max_length) is finished only when it ranks within the first K, as
  # in fairseq; hypotheses cut at max_length compete with those that ended in EOS.
  ends = (tokens == ranking.eos_id) | (i + 1 == ranking.max_length)
  new_scores = jnp.where(ends & (jnp.arange(2 * k) < k),
                         ranking.penalised(top_log_probs, i + 1), -jnp.inf)
  finished_scores, keep = jax.lax.top_k(
      jnp.concatenate([state.finished_scores, new_scores], axis=1), k)
  finished_seqs = jnp.take_along_axis(
      jnp.concatenate([state.finished_seqs, top_seqs], axis=1), keep[:, :, None], axis=1)
  # A done sentence keeps its hypotheses while its batch runs on.
  finished_scores = jnp.where(state.done[:, None], state.finished_scores, finished_scores)
  finished_seqs = jnp.where(state.done[:, None, None], state.finished_seqs, finished_seqs)

  alive_log_probs, keep = jax.lax.top_k(
      jnp.where(tokens == ranking.eos_id, -jnp.inf, top_log_probs), k)
  rows = jnp.arange(n)[:, None] * k + jnp.take_along_axis(parents, keep, axis=1)
  new_state = state.replace(
      i=i + 1, alive_seqs=jnp.take_along_axis(top_seqs, keep[:, :, None], axis=1),
      alive_log_probs=alive_log_probs, finished_seqs=finished_seqs,
      finished_scores=finished_scores,
      cache=_take_cache(cache, rows.reshape(n * k)))  # [n, K] -> [n*K]
  return new_state.replace(done=state.done | ranking.is_done(new_state))


def _initial_beam_state(cache, context, *, batch_size, beam_size, max_length, max_lengths,
                        bos_id, pad_id) -> BeamState:
  b, k = batch_size, beam_size
  eos_steps = _eos_steps(max_lengths, b, max_length)
  # The K cache copies are identical: one live beam keeps them from filling the beam with
  # duplicates.
  first_beam = jnp.arange(k) == 0
  return BeamState(
      i=jnp.array(0, jnp.int32),
      alive_seqs=jnp.full((b, k, max_length + 1), pad_id, jnp.int32).at[:, :, 0].set(bos_id),
      alive_log_probs=jnp.broadcast_to(
          jnp.where(first_beam, 0.0, -jnp.inf).astype(jnp.float32), (b, k)),
      finished_seqs=jnp.full((b, k, max_length + 1), pad_id, jnp.int32),
      finished_scores=jnp.full((b, k), -jnp.inf, jnp.float32),
      done=jnp.zeros((b,), bool),
      eos_steps=eos_steps,
      longest=jnp.minimum(eos_steps + 1, max_length),
      sentence=jnp.arange(b),
      context=context,
      cache=cache)


def beam_search(step_fn, cache, *, batch_size, beam_size, max_length, context=None,
                max_lengths=None, length_penalty=1.0, length_penalty_form='fairseq',
                early_stopping=False, smallest_batch=8, bos_id=BOS_ID, eos_id=EOS_ID,
                pad_id=PAD_ID):
  """Decodes the K best hypotheses per sentence by their length-penalised score.

  Keeps K alive and K finished hypotheses per sentence (flax `examples/wmt`,
  fairseq). Each step ranks the 2K best extensions of the alive beams; an EOS
  extension (or any extension at `max_length`) is finished only when it ranks
  within the first K, as in fairseq, which makes beam size 1 greedy search at
  alpha 0. By default a sentence is done once no alive hypothesis can beat its
  K-th finished one, which is exact but, for alpha > 0, often means running to
  the length limit; with `early_stopping` it is done as soon as it has K finished
  hypotheses (fairseq's rule, Hugging Face's early_stopping=True). A done
  sentence's hypotheses are final, so a sentence's result never depends on the
  other sentences of its batch. Log-probabilities and scores are float32.

  Finished sentences leave the batch, as in fairseq: the search runs in phases
  of B, B/2, B/4, ... sentences (down to `smallest_batch`), each a while loop
  that hands over to the next, on the sentences still running, once they fit
  in it. A step's cost grows with its rows, so a batch no longer pays full
  price for every step its slowest sentence takes. Each phase is static in
  shape: one compilation per batch shape still covers the whole search, though
  every phase adds its loop body to the compile time.

  Args:
    step_fn: `(tokens [B*K], cache, position, context) -> (logits [B*K, V],
      cache)`, called with the rows and context of the sentences still in the
      phase.
    cache: pytree of arrays with leading dimension B*K, sentence b's K rows at
      b*K .. b*K+K-1 (`tile_beams` of a per-sentence cache); every leaf is
      reordered along axis 0 as beams are re-ranked. Or a `SearchCache`, whose
      `hypotheses` are reordered so and whose `sentences` ([B]-leading) are not.
    batch_size: B.
    beam_size: K.
    max_length: T, most tokens generated (static int).
    context: pytree of arrays with leading dimension B, what step_fn reads per
      sentence (the source); read, never reordered within a phase.
    max_lengths: optional int32 [B]; sentence b emits EOS at the latest as its
      `max_lengths[b]`-th token.
    length_penalty: alpha; 0 ranks by total log-probability.
    length_penalty_form: 'fairseq' (score / length**alpha) or 'gnmt'
      (score / ((5 + length) / 6)**alpha), length counting EOS.
    early_stopping: a sentence is done at its K-th finished hypothesis (static).
    smallest_batch: fewest sentences a phase is cut down to (static); B or
      more keeps the whole batch to the end.
    bos_id: token fed first.
    eos_id: token that ends a hypothesis.
    pad_id: token written after EOS.

  Returns:
    tokens: int32 [B, K, T], best first; slots no hypothesis filled hold pad.
    scores: float32 [B, K] penalised log-probabilities, -inf for empty slots.
  """
  if length_penalty_form not in _LENGTH_PENALTIES:
    raise ValueError(f'Unknown length_penalty_form {length_penalty_form!r}; '
                     f'valid: {sorted(_LENGTH_PENALTIES)}')
  ranking = _Ranking(beam_size=beam_size, max_length=max_length, length_penalty=length_penalty,
                     penalty=_LENGTH_PENALTIES[length_penalty_form],
                     early_stopping=early_stopping, eos_id=eos_id)
  state = _initial_beam_state(cache, context, batch_size=batch_size, beam_size=beam_size,
                              max_length=max_length, max_lengths=max_lengths, bos_id=bos_id,
                              pad_id=pad_id)
  body = functools.partial(_beam_step, step_fn=step_fn, ranking=ranking)
  seqs, scores = state.finished_seqs, state.finished_scores
  # Each phase runs while more sentences are running than the next one holds (the last: while
  # any is).
  for next_size in _phase_sizes(batch_size, smallest_batch)[1:] + [0]:

    def cond(state, next_size=next_size):
      return (state.i < max_length) & (jnp.sum(~state.done) > next_size)

    state = jax.lax.while_loop(cond, body, state)
    # Done sentences leave with their results; the rest are written again later.
    seqs = seqs.at[state.sentence].set(state.finished_seqs)
    scores = scores.at[state.sentence].set(state.finished_scores)
    if next_size:
      running_first = jnp.argsort(state.done, stable=True)
      state = _take_sentences(state, running_first[:next_size], beam_size)
  return seqs[:, :, 1:], scores
