"""Greedy and beam search against exhaustive search on scripted step functions.

Dimensions: B batch, K beam, N rows fed (B or B*K), T target length, V vocab.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model import decoding, top_k

PAD, EOS, BOS = 0, 1, 2
V = 4  # Every token, pad and BOS included, can be generated.
T = 4
# Beam size at which beam search is exact for V and T: it holds every prefix.
EXACT_K = V**(T - 1)
B = 3


def _code(prefix):
  """Unique integer of a fed prefix (BOS included), digits token + 1 in base V + 1."""
  code = 0
  for token in prefix:
    code = code * (V + 1) + token + 1
  return code


def _history_step(tokens, cache, position, context=None):
  """Logits looked up by the whole fed prefix, which the cache holds.

  cache: ({'history': int32 [N, T]}, float32 [N, (V + 1)**T, V]), the fed tokens
  and one table per sentence indexed by `_code`, so a cache row that stayed with
  the wrong beam or sentence changes the logits.
  """
  del context
  history = cache[0]['history'].at[:, position].set(tokens)
  code = jnp.zeros_like(tokens)
  for j in range(T):
    code = jnp.where(j <= position, code * (V + 1) + history[:, j] + 1, code)
  logits = jnp.take_along_axis(cache[1], code[:, None, None], axis=1)
  return logits[:, 0], ({'history': history}, cache[1])  # [N, V]


def _position_step(tokens, cache, position, context=None):
  """Logits set by the position alone: cache {'table': float32 [N, T, V]}."""
  del tokens, context
  return cache['table'][:, position], cache


def _context_step(tokens, cache, position, context):
  """`_history_step` with each sentence's table in the context [B, (V + 1)**T, V]
  instead of the cache, so a context row that left its sentence changes the logits."""
  rows_per_sentence = tokens.shape[0] // context.shape[0]
  table = jnp.repeat(context, rows_per_sentence, axis=0)  # [N, (V + 1)**T, V]
  logits, (history, _) = _history_step(tokens, (cache, table), position)
  return logits, history


def _log_softmax(x):
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _brute_force(log_probs_fn, max_length, alpha, form, limit=None, top=5):
  """Best `top` hypotheses of one sentence by scoring every one of them.

  Args:
    log_probs_fn: maps a generated prefix (tuple) to next-token log-probs [V].
    max_length: T; without `limit`, hypotheses not ended by EOS end here.
    alpha: length penalty exponent.
    form: 'fairseq' or 'gnmt'.
    limit: if given, hypotheses must end in EOS within this many tokens.
    top: how many to return.

  Returns:
    [(penalised score, tokens tuple)], best first.
  """
  penalty = {'fairseq': lambda n: n**alpha,
             'gnmt': lambda n: ((5 + n) / 6)**alpha}[form]
  hypotheses = []

  def extend(prefix, log_prob):
    n = len(prefix) + 1
    for token, token_log_prob in enumerate(log_probs_fn(prefix)):
      if token_log_prob == -np.inf:
        continue
      total = log_prob + token_log_prob
      if token == EOS or (limit is None and n == max_length):
        hypotheses.append((total / penalty(n), prefix + (token,)))
      elif n < (limit or max_length):
        extend(prefix + (token,), total)

  extend((), 0.0)
  return sorted(hypotheses, key=lambda h: -h[0])[:top]


def _assert_matches(tokens, scores, expected):
  """tokens [K, T] and scores [K] of one sentence against `_brute_force`."""
  for k, (score, sequence) in enumerate(expected):
    np.testing.assert_allclose(scores[k], score, rtol=1e-5, atol=1e-5)
    assert tuple(tokens[k, :len(sequence)]) == sequence
    assert np.all(tokens[k, len(sequence):] == PAD)


def _history_cache(table):
  """Cache of `_history_step` for tables [B, (V + 1)**T, V], nothing fed yet."""
  table = jnp.asarray(table, jnp.float32)
  return ({'history': jnp.zeros((table.shape[0], T), jnp.int32)}, table)


def _random_cache(seed, batch_size=B):
  """Cache with random per-sentence tables, and their log-softmax [B, (V + 1)**T, V]."""
  table = np.random.default_rng(seed).normal(size=(batch_size, (V + 1)**T, V))
  return _history_cache(table), _log_softmax(table.astype(np.float32))


@functools.lru_cache(maxsize=None)
def _jit_beam(step_fn, batch_size, beam_size, max_length, form='fairseq',
              early_stopping=False, smallest_batch=8):
  return jax.jit(functools.partial(
      decoding.beam_search, step_fn, batch_size=batch_size, beam_size=beam_size,
      max_length=max_length, length_penalty_form=form,
      early_stopping=early_stopping, smallest_batch=smallest_batch))


@functools.lru_cache(maxsize=None)
def _jit_greedy(step_fn, batch_size, max_length):
  return jax.jit(functools.partial(
      decoding.greedy_search, step_fn, batch_size=batch_size,
      max_length=max_length))


@pytest.mark.parametrize('form', ['fairseq', 'gnmt'])
@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0, 2.0, -0.5])
@pytest.mark.parametrize('seed', [0, 1])
def test_beam_search_matches_brute_force(form, alpha, seed):
  # The logits depend on the cached history, so this also checks that cache
  # rows are reordered with their beams.
  cache, log_probs = _random_cache(seed)
  search = _jit_beam(_history_step, B, EXACT_K, T, form)
  tokens, scores = search(decoding.tile_beams(cache, EXACT_K),
                          length_penalty=alpha)
  assert tokens.shape == (B, EXACT_K, T) and scores.shape == (B, EXACT_K)
  for b in range(B):
    expected = _brute_force(lambda p, b=b: log_probs[b, _code((BOS,) + p)],
                            T, alpha, form)
    _assert_matches(np.asarray(tokens[b]), np.asarray(scores[b]), expected)


@pytest.mark.parametrize('early_stopping', [False, True])
def test_finished_sentences_leave_the_batch_without_changing_any_result(early_stopping):
  # Limits of 1..4 tokens make the sentences finish at different steps, so
  # phases of 16, 8, 4, 2 and 1 sentences each take over part of the search.
  sentences, beams = 16, 3
  rng = np.random.default_rng(5)
  table = rng.normal(size=(sentences, (V + 1)**T, V)).astype(np.float32)
  limits = jnp.asarray(rng.integers(1, T + 1, size=sentences))
  history = decoding.tile_beams({'history': jnp.zeros((sentences, T), jnp.int32)}, beams)
  rows_fed = []

  def step(tokens, cache, position, context):
    jax.debug.callback(lambda fed: rows_fed.append(fed.shape[0]), tokens)
    return _context_step(tokens, cache, position, context)

  search = lambda smallest, batch: _jit_beam(step, batch, beams, T, 'fairseq', early_stopping, smallest)
  whole = search(sentences, sentences)(history, context=table, length_penalty=1.0, max_lengths=limits)
  jax.effects_barrier()  # the callbacks have run
  assert set(rows_fed) == {sentences * beams}
  rows_fed.clear()
  compacted = search(1, sentences)(history, context=table, length_penalty=1.0, max_lengths=limits)
  jax.effects_barrier()
  assert min(rows_fed) < sentences * beams
  np.testing.assert_array_equal(compacted[0], whole[0])
  np.testing.assert_array_equal(compacted[1], whole[1])
  # A sentence decoded alone gets the same hypotheses as in its batch.
  one = {'history': jnp.zeros((beams, T), jnp.int32)}
  for b in range(sentences):
    alone = search(1, 1)(one, context=table[b:b + 1], length_penalty=1.0, max_lengths=limits[b:b + 1])
    np.testing.assert_array_equal(alone[0][0], whole[0][b])
    np.testing.assert_allclose(alone[1][0], whole[1][b], rtol=1e-6)


def test_per_sentence_limits_force_eos():
  cache, log_probs = _random_cache(seed=3)
  limits = [1, 2, 4]
  tokens, scores = _jit_beam(_history_step, B, EXACT_K, T)(
      decoding.tile_beams(cache, EXACT_K), length_penalty=1.0,
      max_lengths=jnp.array(limits))
  for b, limit in enumerate(limits):
    expected = _brute_force(lambda p, b=b: log_probs[b, _code((BOS,) + p)],
                            T, 1.0, 'fairseq', limit=limit)
    _assert_matches(np.asarray(tokens[b]), np.asarray(scores[b]), expected)
  # A one-token limit leaves a single hypothesis: EOS.
  assert np.all(np.asarray(scores[0, 1:]) == -np.inf)


@pytest.mark.parametrize('form', ['fairseq', 'gnmt'])
def test_early_stop_keeps_the_best(form):
  # Only EOS and token 3 are possible, so beams of 2 are exact over 10 steps
  # while the finished sets fill early and the stopping bound decides.
  max_length, sentences = 10, 64
  rng = np.random.default_rng(4)
  steps = []

  def step(tokens, cache, position, context=None):
    jax.debug.callback(steps.append, position)
    return _position_step(tokens, cache, position)

  search = _jit_beam(step, sentences, 2, max_length, form)
  for alpha in [0.0, 0.5, 1.0, 3.0, -1.0]:
    table = 2 * rng.normal(size=(sentences, max_length, V))
    table[:, :, [PAD, BOS]] = -np.inf
    tokens, scores = search(decoding.tile_beams({'table': table}, 2),
                            length_penalty=alpha)
    log_probs = _log_softmax(table)
    for b in range(sentences):
      expected = _brute_force(lambda p, b=b: log_probs[b, len(p)], max_length,
                              alpha, form, top=2)
      _assert_matches(np.asarray(tokens[b]), np.asarray(scores[b]), expected)
  # Where EOS is likely every sentence is decided long before max_length.
  table[:, :, EOS] += 5.0
  steps.clear()
  search(decoding.tile_beams({'table': table}, 2), length_penalty=1.0)
  jax.effects_barrier()  # the callbacks have run
  assert len(steps) < max_length


@pytest.mark.parametrize('form, alpha', [('fairseq', 1.0), ('gnmt', 4.0)])
def test_early_stop_waits_for_a_hypothesis_that_wins_at_full_length(form, alpha):
  # [EOS] finishes first; [3] is then worse at every length it could end at
  # next, but its continuations cost almost nothing, so [3, 3, 3, 3] wins.
  probs = np.full(((V + 1)**T, V), 0.25)
  probs[_code([BOS])] = 0.11, 0.6, 0.11, 0.18  # pad, EOS, BOS, 3.
  for n in range(1, T):
    probs[_code([BOS] + [3] * n)] = 0.01, 0.01, 0.01, 0.97
  log_probs = np.log(probs, dtype=np.float32)
  best = _brute_force(lambda p: log_probs[_code((BOS,) + p)], T, alpha, form)
  assert best[0][1] == (3, 3, 3, 3)
  cache = _history_cache(np.broadcast_to(log_probs, (4,) + log_probs.shape))
  tokens, _ = _jit_beam(_history_step, 4, 1, T, form)(cache, length_penalty=alpha)
  assert tokens[0, 0].tolist() == [3, 3, 3, 3]


def test_early_stopping_ends_a_sentence_at_its_kth_finished_hypothesis():
  # The case above: exact search waits for [3, 3, 3, 3]; fairseq's rule stops
  # when [EOS] is the one (K = 1) finished hypothesis, after one step.
  probs = np.full(((V + 1)**T, V), 0.25)
  probs[_code([BOS])] = 0.11, 0.6, 0.11, 0.18  # pad, EOS, BOS, 3.
  for n in range(1, T):
    probs[_code([BOS] + [3] * n)] = 0.01, 0.01, 0.01, 0.97
  log_probs = np.log(probs, dtype=np.float32)
  cache = _history_cache(np.broadcast_to(log_probs, (4,) + log_probs.shape))
  steps = []

  def step(tokens, cache, position, context=None):
    jax.debug.callback(steps.append, position)
    return _history_step(tokens, cache, position)

  tokens, scores = _jit_beam(step, 4, 1, T, 'fairseq', True)(cache, length_penalty=1.0)
  jax.effects_barrier()
  assert tokens[0, 0].tolist() == [EOS, PAD, PAD, PAD] and len(steps) == 1
  np.testing.assert_allclose(scores[:, 0], np.log(0.6), rtol=1e-6)


@pytest.mark.parametrize('seed', [0, 1])
def test_early_stopping_fills_k_hypotheses_and_never_beats_the_exact_search(seed):
  cache, _ = _random_cache(seed)
  _, exact_scores = _jit_beam(_history_step, B, EXACT_K, T)(
      decoding.tile_beams(cache, EXACT_K), length_penalty=1.0)
  tokens, scores = _jit_beam(_history_step, B, EXACT_K, T, 'fairseq', True)(
      decoding.tile_beams(cache, EXACT_K), length_penalty=1.0)
  assert np.isfinite(np.asarray(scores)).all()
  assert (np.asarray(scores)[:, 0] <= np.asarray(exact_scores)[:, 0] + 1e-6).all()


@pytest.mark.parametrize('form', ['fairseq', 'gnmt'])
def test_length_penalty_changes_the_winner(form):
  probs = np.full(((V + 1)**T, V), 0.025)
  probs[:, EOS] = 0.925
  # [EOS] has the higher total log-prob, [3, EOS] the higher per-token one.
  probs[_code([BOS]), [EOS, 3]] = 0.4, 0.55
  probs[_code([BOS, 3]), [EOS, 3]] = 0.7, 0.25
  log_probs = np.log(probs, dtype=np.float32)
  cache = decoding.tile_beams(
      _history_cache(np.broadcast_to(log_probs, (B,) + log_probs.shape)), EXACT_K)
  search = _jit_beam(_history_step, B, EXACT_K, T, form)
  assert search(cache, length_penalty=0.0)[0][0, 0].tolist() == [EOS, PAD, PAD, PAD]
  assert search(cache, length_penalty=1.0)[0][0, 0].tolist() == [3, EOS, PAD, PAD]


def _python_greedy(step_fn, cache, max_length, limits):
  """Argmax decoding one step at a time in Python, int [B, T].

  limits: per-sentence most tokens, EOS forced at the last; None for no limit.
  """
  tokens = np.full((len(limits), max_length), PAD)
  last, done = np.full(len(limits), BOS), np.zeros(len(limits), bool)
  step_fn = jax.jit(step_fn)
  for position in range(max_length):
    logits, cache = step_fn(jnp.asarray(last), cache, jnp.int32(position), None)
    for b, limit in enumerate(limits):
      if not done[b]:
        forced = limit is not None and position == min(limit, max_length) - 1
        last[b] = EOS if forced else int(np.argmax(logits[b]))
        tokens[b, position], done[b] = last[b], last[b] == EOS
      else:
        last[b] = PAD
  return tokens


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_greedy_equals_a_python_argmax_loop(seed):
  cache, _ = _random_cache(seed, batch_size=4)
  limits = [10, 1, 2, 3]  # 10 clips to T: EOS is forced at T.
  expected = _python_greedy(_history_step, cache, T, [None] * 4)
  np.testing.assert_array_equal(_jit_greedy(_history_step, 4, T)(cache), expected)
  expected = _python_greedy(_history_step, cache, T, limits)
  np.testing.assert_array_equal(
      _jit_greedy(_history_step, 4, T)(cache, max_lengths=jnp.array(limits)),
      expected)


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
def test_beam_size_one_is_greedy(seed):
  cache, _ = _random_cache(seed, batch_size=4)
  greedy = _jit_greedy(_history_step, 4, T)(cache)
  tokens, _ = _jit_beam(_history_step, 4, 1, T)(cache, length_penalty=0.0)
  np.testing.assert_array_equal(tokens[:, 0], greedy)


@pytest.mark.parametrize('seed', [0, 1])
def test_only_pad_after_eos_and_within_limits(seed):
  cache, _ = _random_cache(seed, batch_size=4)
  limits = np.array([1, 2, 3, 4])
  greedy = _jit_greedy(_history_step, 4, T)(cache, max_lengths=jnp.array(limits))
  cache, _ = _random_cache(seed)
  beams, scores = _jit_beam(_history_step, B, EXACT_K, T)(
      decoding.tile_beams(cache, EXACT_K), length_penalty=1.0,
      max_lengths=jnp.array(limits[:B]))
  filled = np.isfinite(np.asarray(scores))  # [B, K]
  for tokens, limit in [(np.asarray(greedy), limits),
                        (np.asarray(beams)[filled], limits[np.nonzero(filled)[0]])]:
    ends = np.argmax(tokens == EOS, axis=1)  # First EOS; every row has one.
    assert np.all(tokens[np.arange(len(tokens)), ends] == EOS)
    assert np.all(ends < limit)
    assert np.all((tokens == PAD) | (np.arange(T) <= ends[:, None]))


@pytest.mark.parametrize('vocab,k', [(8000, 10), (256, 8), (100, 4), (64, 4)])
def test_top_k_by_blocks_equals_lax_top_k_ties_included(vocab, k):
  # Values on a coarse grid tie often; rows that are -inf but for a few entries (a forced EOS)
  # make the tail of the ranking all ties.
  rng = np.random.default_rng(vocab)
  x = np.round(rng.normal(size=(3, 5, vocab)) * 4) / 4
  x[1, 2, :] = -np.inf
  x[1, 2, [7, 40]] = 0.5
  x[2, 0, :] = 1.0
  x = jnp.asarray(x, jnp.float32)
  values, indices = top_k.top_k_by_blocks(x, k)
  expected_values, expected_indices = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(indices, expected_indices)
  assert indices.dtype == jnp.int32


def test_tile_beams_keeps_copies_adjacent():
  tree = {'a': jnp.arange(6).reshape(2, 3), 'b': (jnp.arange(2),)}  # [B, 3]
  tiled = decoding.tile_beams(tree, 3)
  assert tiled['a'].shape == (6, 3)
  assert tiled['b'][0].tolist() == [0, 0, 0, 1, 1, 1]


def test_decode_length_limit():
  assert decoding.decode_length_limit(20) == 34
  assert decoding.decode_length_limit(20, a=0, b=2) == 40
  np.testing.assert_array_equal(
      decoding.decode_length_limit(jnp.array([0, 5, 20])), [10, 16, 34])


def test_unknown_length_penalty_form_lists_the_valid_ones():
  with pytest.raises(ValueError, match='fairseq'):
    decoding.beam_search(_position_step, {}, batch_size=1, beam_size=1,
                         max_length=1, length_penalty_form='wu')
