"""Checkpointer: exact round trip, retention, reopening and interrupted saves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import checkpointing


def _state(seed=0):
  key = jax.random.key(seed)
  return {
      'params': {
          'kernel': jax.random.normal(key, (3, 5)),
          'scale': jax.random.uniform(key, (5,), jnp.bfloat16),
      },
      'opt_state': {'count': jnp.int32(7), 'mu': jax.random.normal(key, (3, 5)) * 1e-30},
      'step': jnp.int32(seed),
  }


def _assert_bitwise_equal(restored, saved):
  assert jax.tree.structure(restored) == jax.tree.structure(saved)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


@pytest.fixture
def checkpointer(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path, keep=2, save_every=1)
  yield ckpt
  ckpt.close()


@pytest.mark.parametrize('abstract_target', [True, False])
def test_round_trip_is_bitwise(tmp_path, abstract_target):
  state = _state(seed=3)
  extra = {'epoch': 2, 'rng': [0, 42], 'data': {'position': 1234}}
  ckpt = checkpointing.Checkpointer(tmp_path, keep=1, save_every=10)
  assert ckpt.save(10, state, extra)
  target = jax.eval_shape(lambda: state) if abstract_target else _state(seed=0)
  restored, restored_extra = ckpt.restore(10, target)
  ckpt.close()
  _assert_bitwise_equal(restored, state)
  assert restored_extra == extra


def test_restore_parts_reads_the_named_entries_alone_bitwise(checkpointer):
  state = _state(seed=4)
  checkpointer.save(1, state, {})
  checkpointer.wait_until_finished()
  parts = checkpointer.restore_parts(1, {'params': jax.eval_shape(lambda: state['params'])})
  _assert_bitwise_equal(parts, {'params': state['params']})
  with pytest.raises(checkpointing.CheckpointError, match='has no batch_stats'):
    checkpointer.restore_parts(1, {'batch_stats': {}, 'params': state['params']})
  wider = {'params': {'kernel': jnp.zeros((3, 6)), 'scale': state['params']['scale']}}
  with pytest.raises(checkpointing.CheckpointError, match='kernel'):
    checkpointer.restore_parts(1, wider)


def test_saved_structure_is_read_again_after_a_step_is_set_aside(checkpointer):
  checkpointer.save(1, _state(seed=1), {})
  checkpointer.wait_until_finished()
  assert checkpointer.saved_structure(1)['params']['kernel'].shape == (3, 5)
  checkpointer.set_aside(1)
  wider = dict(_state(seed=1), params={'kernel': jnp.zeros((3, 6))})
  checkpointer.save(1, wider, {}, force=True)
  checkpointer.wait_until_finished()
  assert checkpointer.saved_structure(1)['params']['kernel'].shape == (3, 6)


def test_keeps_latest_and_best(checkpointer):
  for step, loss in zip(range(1, 7), [5.0, 1.0, 3.0, 4.0, 2.0, 6.0]):
    assert checkpointer.save(step, _state(step), {'step': step},
                             metrics={'val_loss': jnp.float32(loss)})
  checkpointer.wait_until_finished()
  assert checkpointer.all_steps() == [2, 5, 6]
  assert checkpointer.best_step() == 2
  assert sorted(p.name for p in checkpointer.directory.iterdir()) == ['2', '5', '6']


def test_saves_only_due_steps_unless_forced(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path, keep=5, save_every=4)
  saved = [step for step in range(1, 10) if ckpt.save(step, _state(), {})]
  assert saved == [4, 8]
  assert ckpt.save(9, _state(), {}, force=True)
  # The end of a run whose last step was due anyway: no error, nothing new.
  assert not ckpt.save(9, _state(), {}, force=True)
  ckpt.close()
  assert ckpt.all_steps() == [4, 8, 9]


def test_checkpoints_without_metrics_leave_best_alone(checkpointer):
  checkpointer.save(1, _state(), {}, metrics={'val_loss': 0.5})
  for step in range(2, 6):
    checkpointer.save(step, _state(), {})
  checkpointer.wait_until_finished()
  assert checkpointer.all_steps() == [1, 4, 5]
  assert checkpointer.best_step() == 1


def test_metrics_must_contain_best_metric(checkpointer):
  with pytest.raises(ValueError, match="'val_loss'"):
    checkpointer.save(1, _state(), {}, metrics={'bleu': 30.0})


def test_reopen_finds_latest_step(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path, keep=3, save_every=1)
  assert ckpt.latest_step() is None
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {'step': step})
  ckpt.close()

  reopened = checkpointing.Checkpointer(tmp_path, keep=3, save_every=1)
  assert reopened.latest_step() == 3
  state, extra = reopened.restore(reopened.latest_step(), jax.eval_shape(_state))
  reopened.close()
  _assert_bitwise_equal(state, _state(3))
  assert extra == {'step': 3}


def test_interrupted_save_leaves_previous_checkpoint(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path, keep=3, save_every=1)
  ckpt.save(1, _state(1), {'step': 1})
  ckpt.close()
  # What a process killed mid-write of step 2 leaves behind: orbax's tmp directory.
  partial = ckpt.directory / '2.orbax-checkpoint-tmp-1700000000'
  (partial / 'state').mkdir(parents=True)
  (partial / 'state' / 'half_written').write_text('garbage')

  reopened = checkpointing.Checkpointer(tmp_path, keep=3, save_every=1)
  assert reopened.latest_step() == 1
  state, extra = reopened.restore(1, jax.eval_shape(_state))
  _assert_bitwise_equal(state, _state(1))
  assert extra == {'step': 1}
  # Saving the step again works and clears the leftover.
  assert reopened.save(2, _state(2), {'step': 2})
  reopened.close()
  assert reopened.all_steps() == [1, 2]
  assert not partial.exists()
