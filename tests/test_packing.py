"""Packed training rows (data.pack_length): the plan, the arrays, and a model that keeps pairs apart.

The defining property: a pair's logits, loss and gradient contributions are the same whether it
has a row of its own or shares one with other pairs.
"""

import functools
import itertools

import jax
import numpy as np
import optax
import pytest

from configs import base
from data import batching, pipeline, token_ids
from model.config import ModelConfig
from model.transformer import Transformer
from training import config_checks, train_state

VOCAB = 41
RNG = np.random.default_rng(0)
# Seven pairs of random lengths, no EOS (the pipeline adds it).
SOURCES = token_ids.RaggedIds.from_lists([list(RNG.integers(3, VOCAB, n)) for n in (4, 9, 2, 6, 3, 7, 5)])
TARGETS = token_ids.RaggedIds.from_lists([list(RNG.integers(3, VOCAB, n)) for n in (5, 3, 6, 2, 8, 4, 6)])
# Rows of 16 tokens per side: (4+1) + (9+1) sources and (5+1) + (3+1) targets share the first.
PACKED_ROWS = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5]), np.array([6]), np.array([], int)]


def tiny_config(**overrides) -> ModelConfig:
  config = base.get_config().model
  config.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2)
  config.update(overrides)
  return ModelConfig.from_config(config, source_vocab_size=VOCAB, target_vocab_size=VOCAB)


def unpacked_batch():
  return pipeline.assemble(SOURCES, TARGETS, np.arange(7), 16, 16)


def test_packed_rows_hold_each_pair_as_its_own_row_would_with_segments_and_positions():
  packed = pipeline.assemble_packed(SOURCES, TARGETS, PACKED_ROWS, 16)
  single = unpacked_batch()
  for row, pairs in enumerate(PACKED_ROWS):
    for side, tokens in (('encoder', ['encoder_input_tokens']),
                         ('decoder', ['decoder_input_tokens', 'decoder_target_tokens'])):
      column = 0
      for segment, pair in enumerate(pairs, 1):
        span = int((single[tokens[0]][pair] != 0).sum())
        for name in tokens:
          np.testing.assert_array_equal(packed[name][row, column:column + span],
                                        single[name][pair, :span])
        np.testing.assert_array_equal(packed[f'{side}_segment_ids'][row, column:column + span], segment)
        np.testing.assert_array_equal(packed[f'{side}_positions'][row, column:column + span],
                                      np.arange(span))
        column += span
      for name in tokens + [f'{side}_segment_ids', f'{side}_positions']:
        assert not packed[name][row, column:].any()  # the rest of the row is padding
  np.testing.assert_array_equal(packed['decoder_target_weights'], packed['decoder_target_tokens'] != 0)
  assert packed['decoder_target_weights'].sum() == single['decoder_target_weights'].sum()


def test_plan_packs_every_short_pair_once_into_rows_that_fit_and_keeps_long_pairs_alone():
  lengths = np.random.default_rng(1)
  source_lengths = lengths.integers(2, 60, 3000)
  target_lengths = np.clip(source_lengths + lengths.integers(-5, 6, 3000), 2, 64)
  plan = batching.make_plan(source_lengths, target_lengths, max_length=56, max_tokens=1024,
                            batch_multiple=2, seed=3, pack_length=24)
  kept = np.flatnonzero(np.maximum(source_lengths, target_lengths) <= 56)
  np.testing.assert_array_equal(np.sort(plan.example_ids), kept)  # every kept pair once
  assert list(plan.lengths) == [24, 32, 48, 56] and list(plan.batch_sizes) == [42, 32, 20, 18]
  for row, bucket in enumerate(plan.row_buckets):
    pairs = plan.row_pairs(row)
    longer = np.maximum(source_lengths[pairs], target_lengths[pairs])
    if bucket == 0:
      assert source_lengths[pairs].sum() <= 24 and target_lengths[pairs].sum() <= 24
    else:
      assert len(pairs) == 1 and plan.lengths[bucket - 1] < longer[0] <= plan.lengths[bucket]
  assert plan.row_pairs(0).size > 1  # packing happened
  for epoch in (0, 1):
    batches = plan.epoch_batches(epoch)
    assert len(batches) == plan.batches_per_epoch
    rows = np.concatenate([rows for _, rows in batches])
    np.testing.assert_array_equal(np.sort(rows), np.arange(len(plan.row_buckets)))
    assert all(len(rows) <= plan.batch_sizes[bucket] for bucket, rows in batches)
  same = batching.make_plan(source_lengths, target_lengths, max_length=56, max_tokens=1024,
                            batch_multiple=2, seed=3, pack_length=24)
  np.testing.assert_array_equal(same.example_ids, plan.example_ids)  # the seed decides


def test_without_packing_the_plan_and_its_batches_are_one_pair_per_row_in_id_order():
  source_lengths = np.array([3, 20, 9, 30, 5])
  target_lengths = np.array([4, 18, 12, 29, 6])
  plan = batching.make_plan(source_lengths, target_lengths, max_length=32, max_tokens=64,
                            batch_multiple=1, seed=0)
  np.testing.assert_array_equal(plan.example_ids, np.arange(5))
  np.testing.assert_array_equal(plan.row_starts, np.arange(6))


@pytest.mark.parametrize('position,norm_position', list(itertools.product(
    ['sinusoidal', 'learned', 'rope', 'alibi'], ['pre', 'post'])))
def test_a_pair_gets_the_same_logits_in_a_packed_row_as_in_its_own(position, norm_position):
  model = Transformer(tiny_config(position=position, norm_position=norm_position))
  single = unpacked_batch()
  packed = pipeline.assemble_packed(SOURCES, TARGETS, PACKED_ROWS, 16)
  variables = model.init(jax.random.PRNGKey(0), single['encoder_input_tokens'],
                         single['decoder_input_tokens'])
  alone = model.apply(variables, single['encoder_input_tokens'], single['decoder_input_tokens'])
  together = model.apply(variables, packed['encoder_input_tokens'], packed['decoder_input_tokens'],
                         **train_state.packing_features(packed))
  for row, pairs in enumerate(PACKED_ROWS):
    column = 0
    for pair in pairs:
      span = int(single['decoder_target_weights'][pair].sum())
      np.testing.assert_allclose(together[row, column:column + span], alone[pair, :span],
                                 rtol=1e-5, atol=1e-5)
      column += span


def test_a_packed_batch_trains_like_the_same_pairs_one_per_row():
  """Loss, metrics and the updated parameters of one step without dropout.

  Plain SGD, so the update is the gradient itself: Adam's first step would scale the rounding
  noise of gradients that are zero in exact arithmetic (attention key biases) up to the rate.
  """
  model = Transformer(tiny_config(dropout_rate=0.0))
  tx = optax.sgd(1.0)
  state = train_state.create_train_state(model, tx, seed=0)
  step = jax.jit(functools.partial(train_state.train_step, model=model, tx=tx, label_smoothing=0.1,
                                   dropout_key=jax.random.PRNGKey(0)))
  single = {name: value for name, value in unpacked_batch().items() if name != 'example_index'}
  packed = pipeline.assemble_packed(SOURCES, TARGETS, PACKED_ROWS, 16)
  single_state, single_metrics = step(state, single)
  packed_state, packed_metrics = step(state, packed)
  for name in single_metrics:
    np.testing.assert_allclose(packed_metrics[name], single_metrics[name], rtol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               packed_state.params, single_state.params)


def test_bad_pack_length_is_refused_in_one_line():
  config = base.get_config()
  config.data.pack_length = -8
  with pytest.raises(ValueError, match=r'config.data.pack_length=-8 must be 0 \(no packing\) or a row'):
    config_checks.check_config(config)
