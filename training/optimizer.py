"""Optimizer and learning-rate schedule built from `config.optim`.

Every schedule warms up linearly from 0 to the peak `optim.learning_rate` over
`optim.warmup_steps` (W), then follows `optim.schedule`. With t the number of
updates already applied (optax's count, so the first update uses lr(0)) and
P the peak:

  inverse_sqrt  P * sqrt(w / (t - W + w)) with w = `optim.inverse_sqrt_scale`
                or, where that is 0, max(W, 1): fairseq's P * sqrt(W / t) when
                W > 0; with W = 0 it starts at P and decays as P / sqrt(t + 1)
                instead of dividing by zero. A fixed w gives runs that differ
                in warmup alone the same decay after it.
  cosine        P * (1 + cos(pi * (t - W) / (T - W))) / 2, reaching 0 at
                T = total_steps and staying there.
  linear        P * (1 - (t - W) / (T - W)), reaching 0 at T.
  constant      P.
  step          P * decay_factor ** #{e in decay_epochs: t >= e * steps_per_epoch};
                an epoch that ends inside the warmup takes effect when it ends.

W = 0 skips the warmup, so every schedule starts at P.

T may be a traced scalar: the trainer's compiled step takes the run's length
as an argument, so a length planned mid-run (training/time_budget.py), or runs
that differ only in length, reuse one compiled program. A `RunLength` instead
of T also says where a time budget's later plan moved the end of a run whose
schedule was made for T (cosine and linear only).

P and W are arguments of the compiled step too (`ScheduleValues`): runs that
differ only in peak rate or warmup reuse one compiled program, and members
trained together (training/members.py) each follow their own.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from model.choices import lookup

class RunLength(NamedTuple):
  """A run's length as its learning-rate schedule sees it.

  The schedule was made for `horizon` steps. A later plan of a budgeted run (training/time_budget.py)
  moves the end to `last_step` at step `revised_at`, where the schedule had reached position
  `revised_from`: from there the rest of the schedule is stretched (or squeezed) over the steps
  left, so the learning rate stays continuous and reaches 0 at `last_step` instead of jumping to
  another horizon's value. Never revised: revised_at = revised_from = 0 and last_step = horizon.
  Python numbers on the host; float32 scalars as the compiled step's argument (a pytree).
  """
  horizon: int | float | jax.Array
  revised_at: int | float | jax.Array
  revised_from: int | float | jax.Array
  last_step: int | float | jax.Array

  @classmethod
  def fixed(cls, steps: int) -> 'RunLength':
    return cls(steps, 0, 0, steps)

  def position(self, count):
    """The schedule's step at optimizer step `count` >= revised_at (earlier counts followed earlier
    lengths): exactly `count` while the pace is 1 (never revised), and the horizon from
    `last_step` on."""
    steps_left = self.last_step - self.revised_at
    schedule_left = self.horizon - self.revised_from
    paced = jnp.where(steps_left == schedule_left, count - self.revised_at + self.revised_from,
                      self.revised_from + (count - self.revised_at) * (schedule_left / steps_left))
    return jnp.where(count >= self.last_step, self.horizon, paced)

  def revised(self, at_step: int, last_step: int) -> 'RunLength':
    """This length with its end moved to `last_step` (> at_step) from `at_step` on."""
    if last_step <= at_step:
      raise ValueError(f'a run revised at step {at_step} must end after it, not at {last_step}')
    return RunLength(self.horizon, at_step, float(self.position(at_step)), last_step)


class ScheduleValues(NamedTuple):
  """The schedule's hyperparameters as the compiled step takes them: the peak rate P and the
  warmup length W. Python numbers (the config's) on the host; float32 scalars as the step's
  argument, or [M] arrays over members trained together."""
  peak: float | jax.Array
  warmup: int | float | jax.Array

  @classmethod
  def of(cls, optim_config: ml_collections.ConfigDict) -> 'ScheduleValues':
    return cls(optim_config.learning_rate, optim_config.warmup_steps)


# Builds the part of a schedule after warmup from (optim, P, W, T - W, steps_per_epoch); it counts
# steps from the end of warmup.
_DecayBuilder = Callable[..., optax.Schedule]


def _inverse_sqrt(optim, peak, warmup, decay_steps, steps_per_epoch):
  del decay_steps, steps_per_epoch

  # optax 0.2.8 has no inverse-square-root decay, and polynomial_schedule clips
  # its count to a finite horizon, so this one is written out.
  # The warmup also evaluates the decay during warmup, at negative counts it then discards:
  # clipped at 0, so a count of -scale does not divide by zero.
  def schedule(count):
    scale = optim.inverse_sqrt_scale or jnp.maximum(warmup, 1)
    return peak * jnp.sqrt(scale / (jnp.maximum(count, 0) + scale))

  return schedule


def _cosine(optim, peak, warmup, decay_steps, steps_per_epoch):
  del optim, warmup, steps_per_epoch

  # optax.cosine_decay_schedule's expression (alpha 0, exponent 1): optax checks decay_steps > 0
  # when the schedule is made, which a traced length cannot answer (_make_schedule checks it).
  # The length becomes an array only when the schedule is called: making an optimizer (config
  # checks) must not start a JAX backend before eval.py has chosen its CPU devices.
  def schedule(count):
    length = jnp.asarray(decay_steps, jnp.float32)
    count = jnp.minimum(count, length)
    return peak * (0.5 * (1 + jnp.cos(jnp.pi * count / length)))

  return schedule


def _linear(optim, peak, warmup, decay_steps, steps_per_epoch):
  del optim, warmup, steps_per_epoch

  # optax.linear_schedule(peak, 0, decay_steps)'s expression, for the same reasons as _cosine.
  def schedule(count):
    length = jnp.asarray(decay_steps, jnp.float32)
    return peak * (1 - jnp.clip(count, 0, length) / length)

  return schedule


def _constant(optim, peak, warmup, decay_steps, steps_per_epoch):
  del optim, warmup, decay_steps, steps_per_epoch
  return lambda count: peak


def _step(optim, peak, warmup, decay_steps, steps_per_epoch):
  del decay_steps
  if optim.decay_epochs and steps_per_epoch is None:
    raise ValueError(
        "config.optim.schedule='step' needs steps_per_epoch to place"
        f' config.optim.decay_epochs={tuple(optim.decay_epochs)}.')
  # The decay counts from the end of warmup, so count + W is the step; W may be traced, which
  # optax.piecewise_constant_schedule's Python boundaries cannot take. An epoch listed twice
  # decays twice.
  boundaries = jnp.asarray([epoch * steps_per_epoch for epoch in optim.decay_epochs], jnp.float32)
  return lambda count: peak * optim.decay_factor**jnp.sum(count + warmup >= boundaries)


_SCHEDULES: dict[str, _DecayBuilder] = {
    'inverse_sqrt': _inverse_sqrt,
    'cosine': _cosine,
    'linear': _linear,
    'constant': _constant,
    'step': _step,
}


def _adam(optim, learning_rate):
  return optax.adam(learning_rate, b1=optim.b1, b2=optim.b2, eps=optim.eps)


def _adamw(optim, learning_rate):
  # optax scales the decay by the learning rate, as PyTorch's AdamW does.
  return optax.adamw(
      learning_rate, b1=optim.b1, b2=optim.b2, eps=optim.eps,
      weight_decay=optim.weight_decay)


def _sgd(optim, learning_rate):
  return optax.sgd(learning_rate, momentum=optim.b1, nesterov=False)


# The schedules that reach 0 on the last step, so need one after warmup.
_DECAYS_TO_ZERO = ('cosine', 'linear')

_OPTIMIZERS = {
    'adam': _adam,
    'adamw': _adamw,
    'sgd': _sgd,
}


def _make_schedule(
    optim_config: ml_collections.ConfigDict,
    build_decay: _DecayBuilder,
    *,
    steps_per_epoch: int | None,
    total_steps: int | jax.Array | RunLength,
    values: ScheduleValues | None,
) -> optax.Schedule:
  """Returns the learning rate as a function of the optimizer step.

  Args:
    optim_config: `config.optim`.
    build_decay: `_SCHEDULES[optim_config.schedule]`.
    steps_per_epoch: Optimizer steps in one pass over the training split; only
      the 'step' schedule with `decay_epochs` needs it, so None is fine otherwise.
    total_steps: Optimizer steps of the whole run; 'cosine' and 'linear' reach 0
      there. A Python int, or a traced integer scalar inside a compiled step; the
      checks on it run only for an int, so build the optimizer once with the int
      before tracing it with the scalar. Or a `RunLength` (of either kind): the
      schedule of its horizon, revised as it says ('cosine' and 'linear'; the
      other schedules do not depend on the length).
    values: P and W, traced inside a compiled step; None: the config's, checked.

  Returns:
    An optax schedule, jit-compatible.

  Raises:
    ValueError: for a negative warmup, a decaying schedule no longer than its
      warmup, or 'step' decay without steps_per_epoch.
  """
  length = total_steps if isinstance(total_steps, RunLength) else None
  if length is not None:
    total_steps = length.horizon
  if values is None:  # the config's P and W (given values come from a config checked here)
    if optim_config.warmup_steps < 0:
      raise ValueError(f'config.optim.warmup_steps={optim_config.warmup_steps} must be >= 0.')
    values = ScheduleValues.of(optim_config)
  if optim_config.inverse_sqrt_scale < 0:
    raise ValueError(
        f'config.optim.inverse_sqrt_scale={optim_config.inverse_sqrt_scale} must be >= 0'
        ' (0: the warmup length).')
  peak, warmup = values
  decay_steps = total_steps - warmup
  if isinstance(decay_steps, int) and optim_config.schedule in _DECAYS_TO_ZERO and decay_steps <= 0:
    raise ValueError(
        f'config.optim.schedule={optim_config.schedule!r} decays to 0 at the last step, so it'
        f' needs more total steps than config.optim.warmup_steps={warmup}'
        f' (total steps: {total_steps}).')
  decay = build_decay(optim_config, peak, warmup, decay_steps, steps_per_epoch)
  if length is not None and optim_config.schedule in _DECAYS_TO_ZERO:
    # Warmup keeps optax's int count (revisions come after it); the decay counts from its end.
    decay_of_horizon = decay
    decay = lambda count: decay_of_horizon(length.position(count + warmup) - warmup)
  if isinstance(warmup, int) and warmup == 0:
    return decay

  def warmed_up(count):
    # optax.join_schedules of optax.linear_schedule(0, P, W) and the decay, written out for a W
    # that may be traced (linear_schedule checks W > 0 when made) or 0 (the decay from count 0).
    ramp = jnp.clip(count, 0, warmup) / jnp.maximum(warmup, 1)
    return jnp.where(count < warmup, (0.0 - peak) * (1 - ramp) + peak, decay(count - warmup))

  return warmed_up


def make_optimizer(
    optim_config: ml_collections.ConfigDict,
    *,
    steps_per_epoch: int | None,
    total_steps: int | jax.Array | RunLength,
    values: ScheduleValues | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns the optimizer of `config.optim` and the schedule driving it.

  The schedule is returned so the caller can log `schedule(step)` without
  threading injected hyperparameters through the optimizer state.

  Args:
    optim_config: `config.optim`.
    steps_per_epoch: See `_make_schedule`.
    total_steps: See `_make_schedule`.
    values: See `_make_schedule`.

  Returns:
    `(tx, schedule)`: global-norm clipping (when `optim.clip_norm > 0`) chained
    before the optimizer, and the learning-rate schedule it uses.

  Raises:
    ValueError: for an unknown `optim.optimizer` or `optim.schedule`, weight
      decay on an optimizer other than 'adamw', or a negative `clip_norm`.
  """
  build_optimizer = lookup(_OPTIMIZERS, optim_config.optimizer, 'config.optim.optimizer')
  build_decay = lookup(_SCHEDULES, optim_config.schedule, 'config.optim.schedule')
  if optim_config.weight_decay and optim_config.optimizer != 'adamw':
    raise ValueError(
        f'config.optim.weight_decay={optim_config.weight_decay} is decoupled weight'
        f" decay, which only 'adamw' applies; set config.optim.optimizer='adamw'"
        f' or config.optim.weight_decay=0 (optimizer is {optim_config.optimizer!r}).')
  if optim_config.clip_norm < 0:
    raise ValueError(
        f'config.optim.clip_norm={optim_config.clip_norm} must be >= 0 (0 disables).')
  schedule = _make_schedule(
      optim_config, build_decay, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
      values=values)
  tx = build_optimizer(optim_config, schedule)
  if optim_config.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(optim_config.clip_norm), tx)
  return tx, schedule
