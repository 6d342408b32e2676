"""A step computed in slices of rows (train.microbatch_tokens), or with its loss computed in chunks of
tokens (train.loss_chunk_tokens), against the same step on the whole batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base
from data import pipeline
from model.transformer import Transformer
from tests.test_packing import PACKED_ROWS, SOURCES, TARGETS, tiny_config, unpacked_batch
from training import config_checks, train_state


@pytest.mark.parametrize('rows,length,tokens,expected', [
    (170, 24, 512, 8),  # 4,080 tokens: 8 slices of 22 rows (176 with the padding rows)
    (128, 32, 512, 8),
    (128, 32, 1024, 4),
    (256, 16, 0, 1),  # 0: the whole batch
    (3, 64, 16, 3),  # never more slices than rows
])
def test_microbatch_count_is_enough_slices_of_about_the_token_budget(rows, length, tokens, expected):
  assert train_state.microbatch_count(rows, length, tokens) == expected


def test_split_rows_strides_the_rows_and_pads_the_last_slices_with_empty_rows():
  batch = {'tokens': np.arange(1, 11).reshape(5, 2), 'weights': np.ones((5, 2))}
  slices = train_state.split_rows(batch, 2)
  np.testing.assert_array_equal(slices['tokens'], [[[1, 2], [5, 6], [9, 10]],
                                                   [[3, 4], [7, 8], [0, 0]]])
  np.testing.assert_array_equal(slices['weights'][1, 2], [0, 0])
  # Every row exactly once.
  np.testing.assert_array_equal(np.sort(slices['tokens'][slices['tokens'] > 0]), np.arange(1, 11))


def _step(model, tx, microbatch_tokens=0, loss_chunk_tokens=0):
  return jax.jit(functools.partial(train_state.train_step, model=model, tx=tx, label_smoothing=0.1,
                                   dropout_key=jax.random.PRNGKey(0), microbatch_tokens=microbatch_tokens,
                                   loss_chunk_tokens=loss_chunk_tokens))


def _steps(model, tx, microbatch_tokens):
  return [_step(model, tx, tokens) for tokens in (0, microbatch_tokens)]


def _assert_steps_agree(got, want):
  """Two steps' (state, metrics) equal up to float32 summation order."""
  (got_state, got_metrics), (want_state, want_metrics) = got, want
  for name in want_metrics:
    np.testing.assert_allclose(got_metrics[name], want_metrics[name], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               got_state.params, want_state.params)


@pytest.mark.parametrize('packed,microbatch_tokens,slices', [
    (False, 32, 4),  # 7 rows of 16 tokens: 4 slices of 2 rows, the last with an empty row added
    (True, 48, 2),  # 5 packed rows of 16 tokens: 2 slices of 3 rows, likewise
], ids=['one_pair_per_row', 'packed'])
def test_a_sliced_step_equals_the_whole_batch_step_without_dropout(packed, microbatch_tokens, slices):
  model = Transformer(tiny_config(dropout_rate=0.0))
  # SGD with rate 1, so the parameters' change is the gradient. (Adam's first update is about
  # lr * sign(g): it would magnify the rounding noise of the attention key biases, whose gradient
  # is 0 up to rounding.)
  tx = optax.sgd(1.0)
  state = train_state.create_train_state(model, tx, seed=0)
  batch = (pipeline.assemble_packed(SOURCES, TARGETS, PACKED_ROWS, 16) if packed else
           {name: value for name, value in unpacked_batch().items() if name != 'example_index'})
  whole, sliced = _steps(model, tx, microbatch_tokens)
  assert train_state.microbatch_count(len(batch['encoder_input_tokens']), 16, microbatch_tokens) == slices
  _assert_steps_agree(sliced(state, batch), whole(state, batch))


@pytest.mark.parametrize('microbatch_tokens', [0, 48])
def test_a_step_with_the_loss_in_chunks_equals_the_plain_step_with_dropout(microbatch_tokens):
  """Chunks of 5 tokens (not dividing a slice's) give the plain step's loss and parameters: the
  dropout masks are the same, only the loss's normaliser is summed in another order."""
  model = Transformer(tiny_config(dropout_rate=0.3))
  tx = optax.sgd(1.0)
  state = train_state.create_train_state(model, tx, seed=0)
  batch = pipeline.assemble_packed(SOURCES, TARGETS, PACKED_ROWS, 16)
  plain, chunked = [_step(model, tx, microbatch_tokens, chunk) for chunk in (0, 5)]
  _assert_steps_agree(chunked(state, batch), plain(state, batch))


def test_sliced_steps_with_dropout_are_deterministic_and_draw_each_slice_its_own_masks():
  model = Transformer(tiny_config(dropout_rate=0.3))
  tx = optax.sgd(0.1)
  state = train_state.create_train_state(model, tx, seed=0)
  batch = {name: value for name, value in unpacked_batch().items() if name != 'example_index'}
  whole, sliced = _steps(model, tx, 32)
  first, again = sliced(state, batch)[1], sliced(state, batch)[1]
  assert float(first['train_loss']) == float(again['train_loss'])
  assert float(first['train_loss']) != float(whole(state, batch)[1]['train_loss'])


def test_the_default_slices_on_a_cpu_but_not_batchnorm_and_an_explicit_size_with_it_is_refused():
  config = base.get_config()
  assert config.train.microbatch_tokens is None
  assert jax.default_backend() == 'cpu'
  assert train_state.microbatch_tokens(config) == 512
  config.model.dtype = 'bfloat16'  # half the bytes a token: twice the tokens a slice
  assert train_state.microbatch_tokens(config) == 1024
  config.model.dtype = 'float32'
  config.train.microbatch_tokens = 0
  assert train_state.microbatch_tokens(config) == 0
  config.train.microbatch_tokens = None
  config.model.norm = 'batch'
  assert train_state.microbatch_tokens(config) == 0
  config.train.microbatch_tokens = 256
  with pytest.raises(ValueError, match=r"config.train.microbatch_tokens=256 with config.model.norm='batch'"):
    config_checks.check_config(config)
  config.model.norm = 'layer'
  config.train.microbatch_tokens = -1
  with pytest.raises(ValueError, match=r'config.train.microbatch_tokens=-1 must be None'):
    config_checks.check_config(config)


def test_batchnorm_batch_stats_are_refused_by_a_sliced_step():
  model = Transformer(tiny_config(norm='batch', dropout_rate=0.0))
  tx = optax.sgd(0.1)
  state = train_state.create_train_state(model, tx, seed=0)
  batch = {name: value for name, value in unpacked_batch().items() if name != 'example_index'}
  with pytest.raises(ValueError, match='BatchNorm needs the whole batch'):
    _steps(model, tx, 32)[1](state, jax.tree.map(jnp.asarray, batch))
