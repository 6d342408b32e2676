"""The training loop's periodic actions on their own: resume-data formats, clocks, epoch records."""

import math

import jax.numpy as jnp
import pytest

from training import periodic_actions as actions
from training import run_log, train_state


def test_resume_data_of_every_format_reads_as_the_current_one():
  first = {'data_iterator': {'position': 7}, 'epoch': 1}
  second = {**first, 'metrics_window': {'sums': {'steps': 3.0}, 'seconds': 1.5}}
  third = {**second, 'run_seconds': 125.0}
  current = {**third, 'resume_format': actions.RESUME_FORMAT}
  assert actions.upgrade_resume_data(first) == {
      **first, 'metrics_window': None, 'run_seconds': 0.0, 'resume_format': 3}
  assert actions.upgrade_resume_data(second) == {**second, 'run_seconds': 0.0, 'resume_format': 3}
  assert actions.upgrade_resume_data(third) == current
  assert actions.upgrade_resume_data(current) == current
  with pytest.raises(ValueError, match='format 4; this code reads formats up to 3'):
    actions.upgrade_resume_data({**current, 'resume_format': 4})


def test_pauses_leave_the_metrics_window_and_are_summed():
  clock = actions.Clock(run_start=0.0)
  clock.new_window(seconds_so_far=10.0)
  start = clock.window_start
  clock.pause(2.5)
  clock.pause(0.5)
  assert clock.paused == 3.0
  assert clock.window_start == pytest.approx(start + 3.0)


def test_a_non_finite_step_in_the_window_stops_the_run_at_that_step():
  window = actions.MetricsWindow(train_state.empty_metrics_window)
  metrics = {'train_loss': jnp.float32(math.nan), 'train_nll': jnp.float32(1.0),
             'grad_norm': jnp.float32(1.0), 'target_tokens': jnp.float32(10.0)}
  window.sums = train_state.accumulate_metrics(window.sums, metrics, jnp.int32(12))
  with pytest.raises(run_log.DivergenceError, match='at step 12'):
    window.settle()


class _Records:
  def __init__(self):
    self.records = []

  def write(self, step, record):
    self.records.append((step, record))


def test_an_epoch_is_recorded_only_when_this_invocation_trained_all_of_it():
  records = _Records()
  epochs = actions.EpochClock(records, steps_per_epoch=4)
  # Resumed at step 2, inside epoch 0: epoch 0 is not recorded, epoch 1 is.
  progress = actions.Progress(step=2, total_steps=12)
  for group in ((0, 0), (1, 1, 1), (1,), (2,)):  # groups of steps dispatched at once
    epochs.before_steps(progress, list(group))
    progress.step += len(group)
    progress.steps_this_run += len(group)
  assert [(step, record['epoch_finished']) for step, record in records.records] == [(8, 1)]
  assert records.records[0][1]['epoch_seconds'] >= 0


def test_the_eta_adds_the_validations_and_checkpoints_still_due_to_the_training_pace(monkeypatch):
  """100 steps in 260 s of which 60 were paused: 2 s a step. From step 150 of 320, validations
  every 100 are due at 200, 300 and the last step (3), checkpoints every 50 at 150 (reported
  before it is saved), 200, 250, 300 and 320 (5): 170 x 2 + 3 x 10 + 5 x 1 = 375 s."""
  now = [1000.0]
  monkeypatch.setattr(actions.time, 'perf_counter', lambda: now[0])
  clock = actions.Clock(run_start=900.0)
  eta = actions.Eta(clock, eval_every=100, checkpoint_every=50)
  progress = actions.Progress(step=50, total_steps=320)
  assert eta.seconds_left(progress) is None  # no step of this invocation yet
  now[0] += 260.0
  clock.pause(60.0)
  progress.step, progress.steps_this_run = 150, 100
  eta.validation_seconds, eta.save_seconds = 10.0, 1.0
  assert eta.seconds_left(progress) == 375.0
  progress.step = progress.total_steps = 320  # the last step: its validation and save remain
  assert eta.seconds_left(progress) == 10.0 + 1.0
