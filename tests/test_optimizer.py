"""Schedules against their closed forms and optimizers against hand-computed updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from training import optimizer

PEAK = 2e-3
STEPS = np.array([0, 1, 5, 10, 11, 20, 49, 50, 73, 109, 110, 500])


def _optim(**overrides):
  optim = base.get_config().optim
  optim.learning_rate = PEAK
  optim.update(overrides)
  return optim


def make_schedule(optim, **lengths):
  """The learning-rate schedule that make_optimizer drives its optimizer with."""
  return optimizer.make_optimizer(optim, **lengths)[1]


def _evaluate(schedule, steps):
  # optax calls the schedule with an int32 count inside jit; do the same.
  return np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(steps, jnp.int32)))


def _reference(name, steps, *, warmup, total, steps_per_epoch=10, decay_epochs=(2, 5),
               decay_factor=0.5):
  t = steps.astype(np.float64)
  after = t - warmup
  if name == 'inverse_sqrt':
    w = max(warmup, 1)
    # The floor only keeps warmup steps, masked below, from dividing by zero.
    decayed = PEAK * np.sqrt(w / np.maximum(after + w, 1))
  elif name == 'cosine':
    progress = np.minimum(after, total - warmup) / (total - warmup)
    decayed = PEAK * 0.5 * (1 + np.cos(np.pi * progress))
  elif name == 'linear':
    decayed = PEAK * np.clip(1 - after / (total - warmup), 0, 1)
  elif name == 'constant':
    decayed = np.full_like(t, PEAK)
  elif name == 'step':
    passed = sum((t >= epoch * steps_per_epoch).astype(int) for epoch in decay_epochs)
    decayed = PEAK * decay_factor**passed
  warming = PEAK * t / warmup if warmup else 0.0
  return np.where(t < warmup, warming, decayed)


@pytest.mark.parametrize('length_traced', [False, True])
@pytest.mark.parametrize('warmup', [0, 10])
@pytest.mark.parametrize('name', ['inverse_sqrt', 'cosine', 'linear', 'constant', 'step'])
def test_schedule_matches_closed_form(name, warmup, length_traced):
  optim = _optim(schedule=name, warmup_steps=warmup, decay_epochs=(2, 5), decay_factor=0.5)
  if length_traced:  # as in the trainer's compiled step, which takes the run's length as an argument
    values = jax.jit(lambda length: jax.vmap(make_schedule(
        optim, steps_per_epoch=10, total_steps=length))(jnp.asarray(STEPS, jnp.int32)))(110)
  else:
    values = _evaluate(make_schedule(optim, steps_per_epoch=10, total_steps=110), STEPS)
  np.testing.assert_allclose(np.asarray(values), _reference(name, STEPS, warmup=warmup, total=110),
                             rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize('name', ['inverse_sqrt', 'cosine', 'linear', 'constant', 'step'])
def test_traced_peak_and_warmup_give_each_member_its_own_configs_schedule(name):
  """ScheduleValues as the compiled step of members trained together takes them, [M] float32
  arrays vmapped with the run's length traced: each member follows the closed form of its own peak
  and warmup, a warmup of 0 (the decay from the first step) included."""
  members = [(PEAK, 10), (PEAK / 4, 0), (PEAK * 3, 50)]
  optim = _optim(schedule=name, warmup_steps=10, decay_epochs=(2, 5), decay_factor=0.5)
  peaks, warmups = (jnp.asarray(column, jnp.float32) for column in zip(*members))

  def member_rates(peak, warmup, length):
    schedule = make_schedule(optim, steps_per_epoch=10, total_steps=length,
                             values=optimizer.ScheduleValues(peak, warmup))
    return jax.vmap(schedule)(jnp.asarray(STEPS, jnp.int32))

  rates = jax.jit(jax.vmap(member_rates, in_axes=(0, 0, None)))(peaks, warmups, 110)
  for (peak, warmup), member in zip(members, np.asarray(rates)):
    expected = _reference(name, STEPS, warmup=warmup, total=110) * peak / PEAK
    np.testing.assert_allclose(member, expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize('name', ['inverse_sqrt', 'cosine', 'linear', 'constant', 'step'])
def test_a_fixed_run_length_as_the_compiled_step_takes_it_is_the_int_lengths_schedule(name):
  """The trainer passes RunLength.fixed(T) as float32 scalars where it passed T as an int32: a run
  never revised keeps its learning rates, to float32 rounding (XLA may fuse the two programs'
  arithmetic differently: linear's warmup differs in the last bit on this CPU)."""
  optim = _optim(schedule=name, warmup_steps=10, decay_epochs=(2, 5), decay_factor=0.5)
  counts = jnp.arange(120, dtype=jnp.int32)
  by_int = jax.jit(lambda length: jax.vmap(make_schedule(
      optim, steps_per_epoch=10, total_steps=length))(counts))(jnp.int32(110))
  by_run_length = jax.jit(lambda length: jax.vmap(make_schedule(
      optim, steps_per_epoch=10, total_steps=length))(counts))(
          optimizer.RunLength(*(jnp.float32(value) for value in optimizer.RunLength.fixed(110))))
  np.testing.assert_allclose(np.asarray(by_run_length), np.asarray(by_int), rtol=1e-6, atol=0)
  np.testing.assert_allclose(np.asarray(by_run_length),
                             _reference(name, np.arange(120), warmup=10, total=110),
                             rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize('new_end', [150, 80])
@pytest.mark.parametrize('name', ['cosine', 'linear'])
def test_a_revised_run_length_moves_the_rest_of_the_decay_onto_the_steps_left(name, new_end):
  """Revised at step 40 of 110 (warmup 10), the schedule from 40 on is the old one's rest, from
  where it was, spread over the steps to `new_end`: continuous at 40, 0 at the new end (to
  float32 rounding; no update uses that step's rate)."""
  optim = _optim(schedule=name, warmup_steps=10)
  length = optimizer.RunLength.fixed(110).revised(40, new_end)
  assert length == (110, 40, 40.0, new_end)
  counts = np.arange(40, new_end + 5)
  values = _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=length), counts)
  position = 40 + (counts - 40) * (110 - 40) / (new_end - 40)  # where the old schedule is
  np.testing.assert_allclose(values, _reference(name, position, warmup=10, total=110),
                             rtol=1e-5, atol=1e-9)
  old = _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=110), [40])
  assert values[0] == old[0] and values[new_end - 40] < 1e-7 * PEAK and np.all(np.diff(values) <= 0)
  # A second revision goes on from where the first one had brought the schedule.
  again = length.revised(60, 70)
  assert again.revised_from == pytest.approx(40 + 20 * 70 / (new_end - 40))
  after = _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=again), [60, 70])
  before = _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=length), [60])
  assert after[0] == pytest.approx(before[0], rel=1e-6) and after[1] < 1e-7 * PEAK
  with pytest.raises(ValueError, match='must end after it'):
    length.revised(60, 60)


def test_a_revised_run_length_leaves_schedules_that_do_not_end_alone():
  optim = _optim(schedule='inverse_sqrt', warmup_steps=10)
  length = optimizer.RunLength.fixed(110).revised(40, 200)
  counts = np.arange(0, 200, 7)
  assert np.array_equal(
      _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=length), counts),
      _evaluate(make_schedule(optim, steps_per_epoch=None, total_steps=110), counts))


def test_inverse_sqrt_is_fairseq_after_warmup():
  schedule = make_schedule(
      _optim(schedule='inverse_sqrt', warmup_steps=4000), steps_per_epoch=None,
      total_steps=10)
  np.testing.assert_allclose(
      _evaluate(schedule, np.array([2000, 4000, 16000])),
      [PEAK / 2, PEAK, PEAK * np.sqrt(4000 / 16000)], rtol=1e-6)


@pytest.mark.parametrize('warmup', [0, 1000, 4000])
def test_a_fixed_inverse_sqrt_scale_decays_the_same_after_any_warmup(warmup):
  # P * sqrt(w / (t - W + w)) with w fixed at 4000: warmup 4000 is fairseq's P * sqrt(4000 / t);
  # a shorter warmup follows the same curve shifted by the warmup it left out.
  schedule = make_schedule(
      _optim(schedule='inverse_sqrt', warmup_steps=warmup, inverse_sqrt_scale=4000),
      steps_per_epoch=None, total_steps=10)
  after = np.array([0, 3000, 12000, 60000])
  np.testing.assert_allclose(
      _evaluate(schedule, after + warmup), PEAK * np.sqrt(4000 / (after + 4000)), rtol=1e-6)


@pytest.mark.parametrize('name', ['inverse_sqrt', 'cosine', 'linear', 'constant', 'step'])
def test_no_warmup_starts_at_peak(name):
  schedule = make_schedule(
      _optim(schedule=name, warmup_steps=0), steps_per_epoch=10, total_steps=100)
  assert _evaluate(schedule, np.array([0]))[0] == pytest.approx(PEAK, rel=1e-6)


def test_step_decays_at_epoch_boundaries():
  schedule = make_schedule(
      _optim(schedule='step', warmup_steps=5, decay_epochs=(2, 5), decay_factor=0.1),
      steps_per_epoch=100, total_steps=1000)
  np.testing.assert_allclose(
      _evaluate(schedule, np.array([5, 199, 200, 499, 500, 999])),
      [PEAK, PEAK, PEAK * 0.1, PEAK * 0.1, PEAK * 0.01, PEAK * 0.01], rtol=1e-5)


def test_step_decay_needs_steps_per_epoch():
  with pytest.raises(ValueError, match='steps_per_epoch'):
    make_schedule(
        _optim(schedule='step', decay_epochs=(3,)), steps_per_epoch=None, total_steps=100)


@pytest.mark.parametrize('name', ['cosine', 'linear'])
def test_decay_to_zero_needs_steps_after_warmup(name):
  with pytest.raises(ValueError, match='warmup_steps=100'):
    make_schedule(
        _optim(schedule=name, warmup_steps=100), steps_per_epoch=None, total_steps=100)


@pytest.mark.parametrize('field', ['schedule', 'optimizer'])
def test_unknown_name_lists_valid_ones(field):
  optim = _optim(**{field: 'foo'})
  with pytest.raises(ValueError, match=rf"config\.optim\.{field}='foo' is not one of: ") as err:
    optimizer.make_optimizer(optim, steps_per_epoch=None, total_steps=100)
  valid = {'schedule': 'constant, cosine, inverse_sqrt, linear, step',
           'optimizer': 'adam, adamw, sgd'}[field]
  assert valid in str(err.value)


@pytest.mark.parametrize('name', ['adam', 'sgd'])
def test_weight_decay_needs_adamw(name):
  with pytest.raises(ValueError, match="optimizer='adamw'"):
    optimizer.make_optimizer(
        _optim(optimizer=name, weight_decay=0.01), steps_per_epoch=None, total_steps=100)


def _first_update(optim, grads, params):
  tx, _ = optimizer.make_optimizer(optim, steps_per_epoch=None, total_steps=100)
  updates, _ = tx.update(grads, tx.init(params), params)
  return updates


def test_adam_first_step_closed_form():
  optim = _optim(optimizer='adam', schedule='constant', warmup_steps=0, eps=1e-8)
  grads = {'w': jnp.array([0.3, -2.0, 1e-3, 0.0])}
  updates = _first_update(optim, grads, jax.tree.map(jnp.ones_like, grads))
  # Bias correction makes the first moments g and g**2 exactly.
  g = np.asarray(grads['w'])
  np.testing.assert_allclose(updates['w'], -PEAK * g / (np.abs(g) + 1e-8), rtol=1e-6)


def test_adamw_decays_weights_with_zero_gradient():
  optim = _optim(optimizer='adamw', schedule='constant', warmup_steps=0, weight_decay=0.1)
  params = {'w': jnp.array([1.0, -3.0])}
  updates = _first_update(optim, jax.tree.map(jnp.zeros_like, params), params)
  np.testing.assert_allclose(updates['w'], -PEAK * 0.1 * np.array([1.0, -3.0]), rtol=1e-6)


@pytest.mark.parametrize('scale, expected_norm', [(100.0, 1.5), (1e-2, 0.13)])
def test_clipping_bounds_the_update(scale, expected_norm):
  optim = _optim(optimizer='sgd', b1=0.0, schedule='constant', warmup_steps=0,
                 learning_rate=1.0, clip_norm=1.5)
  # Global norm 13 * scale: clipped to clip_norm when large, untouched when small.
  grads = {'a': scale * jnp.array([3.0, 4.0]), 'b': scale * jnp.array([[12.0]])}
  updates = _first_update(optim, grads, grads)
  norm = float(jnp.sqrt(sum(jnp.sum(u**2) for u in jax.tree.leaves(updates))))
  assert norm == pytest.approx(expected_norm, rel=1e-5)


def test_make_optimizer_returns_its_schedule():
  optim = _optim(optimizer='sgd', b1=0.0, schedule='linear', warmup_steps=4)
  tx, schedule = optimizer.make_optimizer(optim, steps_per_epoch=None, total_steps=20)
  params = jnp.zeros(2)
  state = tx.init(params)
  for step in range(6):
    updates, state = tx.update(jnp.ones(2), state, params)
    np.testing.assert_allclose(updates, -schedule(step) * np.ones(2), rtol=1e-6)
