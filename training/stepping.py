"""The compiled training step as the loop calls it: one dispatch per batch, or per group of
`train.steps_per_call` batches of one shape (a lax.scan of the same step), compiled per shape.

The run's length (`optimizer.RunLength`), its peak rate and warmup (`optimizer.ScheduleValues`)
and the seed's dropout key are arguments of the compiled step, not constants inside it: a
budgeted run's plans, and runs that differ only in seed, length, peak rate or warmup, reuse one
compiled program (and the persistent compilation cache). Both are made by
jitted calls, so that every process holds its replica, as it does the state's.

The jitted step itself is kept per process for its model, `StepSettings` and mesh
(`jitted_step_functions`): a later run of the same program in one process (a pod slice's runs
trained in turn, a test after another) finds it traced, lowered and loaded already. The
persistent cache saves only the compilation; tracing and lowering are Python's work, and for a
small model they cost more than the compilation does.
"""

import dataclasses
import functools
import json
import time

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from model.transformer import Transformer
from training import partitioning, train_state
from training.optimizer import RunLength, ScheduleValues, make_optimizer


@dataclasses.dataclass(frozen=True)
class RunSteps:
  """A run's length in optimizer steps, known once its training data is batched."""
  steps_per_epoch: int  # batches in one pass over the training pairs
  max_steps: int  # train.num_epochs epochs when set, else train.num_steps (a time budget may stop sooner)

  @classmethod
  def of(cls, train_config: ml_collections.ConfigDict, steps_per_epoch: int) -> 'RunSteps':
    if train_config.num_epochs:
      return cls(steps_per_epoch, train_config.num_epochs * steps_per_epoch)
    return cls(steps_per_epoch, train_config.num_steps)


class Schedule:
  """The run's learning-rate schedule and its length as the compiled step's argument.

  A time budget's plan moves the run's end (`set`); the records read the rate from here.
  """

  def __init__(self, optim_config: ml_collections.ConfigDict, steps: RunSteps, mesh,
               length: RunLength):
    self._optim_config, self._steps_per_epoch = optim_config, steps.steps_per_epoch
    self._replicated = partitioning.replicated(mesh)
    self.set(length)

  def set(self, length: RunLength) -> None:
    """Follows a run of `length` from now on (checked by make_optimizer)."""
    _, self._schedule = make_optimizer(self._optim_config, steps_per_epoch=self._steps_per_epoch,
                                       total_steps=length)
    # float32 scalars: a revised length's fractional position fits, and every value traces alike.
    self.argument = jax.jit(lambda: RunLength(*(jnp.float32(value) for value in length)),
                            out_shardings=self._replicated)()

  def learning_rate(self, step: int) -> float:
    """The rate of the update that made `step` (optax's count is the updates before it)."""
    return float(self._schedule(step - 1))


class TrainStep:
  """`train_state.train_step` jitted over the mesh, with the step's metrics summed on device.

  The host stays one step ahead of the device: a call waits for the step before it while its own
  runs, so a stop signal (handled between Python calls) acts within a step. A batch shape met for
  the first time compiles before it dispatches (or finds the step of an earlier run in this
  process); those seconds go to `compile_seconds` and to the clock's pauses, not to training
  throughput.
  """

  def __init__(self, config: ml_collections.ConfigDict, model: Transformer, mesh,
               steps: RunSteps, clock):
    replicated = partitioning.replicated(mesh)
    self._mesh, self._clock = mesh, clock
    self._dropout_key = jax.jit(lambda: dropout_key(config.train.seed),
                                out_shardings=replicated)()
    self._schedule_values = jax.jit(lambda: schedule_values(config.optim),
                                    out_shardings=replicated)()
    self.microbatch_tokens = train_state.microbatch_tokens(config)

    self._jitted, self._jitted_group = jitted_step_functions(
        model, StepSettings.of(config, steps, self.microbatch_tokens), mesh)
    self.steps_per_call = config.train.steps_per_call
    # Jitted, so every sum is its own buffer (the step donates them).
    self.new_window = jax.jit(train_state.empty_metrics_window, out_shardings=replicated)
    # Per padded batch shape [B, T, S], and [K, B, T, S] for a group of K steps.
    self.compile_seconds: dict[tuple, float] = {}
    self._previous_step_done = None

  def __call__(self, state: train_state.TrainState, window: dict, local_batches: list[dict],
               length: RunLength) -> tuple[train_state.TrainState, dict]:
    """Trains this process's rows of `local_batches` (BatchGroups' group: steps_per_call batches
    of one shape in one dispatch, or fewer one by one); returns the new state and window."""
    if len(local_batches) == self.steps_per_call > 1:
      stacked = {name: np.stack([batch[name] for batch in local_batches])
                 for name in local_batches[0]}
      return self._dispatch(self._jitted_group, state, window,
                            partitioning.global_batch(stacked, self._mesh, stacked_axes=1),
                            (len(local_batches), *batch_shape(local_batches[0])), length)
    for local_batch in local_batches:
      state, window = self._dispatch(self._jitted, state, window,
                                     partitioning.global_batch(local_batch, self._mesh),
                                     batch_shape(local_batch), length)
    return state, window

  def _dispatch(self, jitted, state, window, batch, shape: tuple, length, *more):
    new_shape = shape not in self.compile_seconds
    if new_shape:
      # The call below compiles before dispatching. Steps already queued would run during the
      # compilation and be counted out of the throughput with it: let them finish first.
      jax.block_until_ready(window)
    dispatch_start = time.perf_counter()
    state, window, step_done = jitted(state, window, batch, self._dropout_key, length,
                                      self._schedule_values, *more)
    if new_shape:
      seconds = time.perf_counter() - dispatch_start
      self.compile_seconds[shape] = seconds
      logging.info('train step compiled for batch shape %s in %.1f s (%d shapes so far)', shape,
                   seconds, len(self.compile_seconds))
      self._clock.pause(seconds)
    if self._previous_step_done is not None:
      jax.block_until_ready(self._previous_step_done)
    self._previous_step_done = step_done
    return state, window


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """What the compiled step is built from besides the model and the mesh: equal settings, equal
  program. Seed, run length, peak rate and warmup are the step's arguments, so runs that differ
  only in them have equal settings."""
  optim_json: str  # config.optim as sorted JSON, without the peak rate and warmup (arguments)
  steps_per_epoch: int  # RunSteps.steps_per_epoch ('step' decay places its boundaries by it)
  label_smoothing: float  # config.train.label_smoothing
  microbatch_tokens: int  # tokens per slice of a step (train_state.microbatch_tokens)
  loss_chunk_tokens: int  # config.train.loss_chunk_tokens

  @classmethod
  def of(cls, config: ml_collections.ConfigDict, steps: RunSteps,
         microbatch_tokens: int) -> 'StepSettings':
    optim = {name: value for name, value in config.optim.to_dict().items()
             if name not in ('learning_rate', 'warmup_steps')}
    return cls(json.dumps(optim, sort_keys=True), steps.steps_per_epoch,
               config.train.label_smoothing, microbatch_tokens, config.train.loss_chunk_tokens)

  def optim_config(self) -> ml_collections.ConfigDict:
    """config.optim as the step sees it: reading learning_rate or warmup_steps there fails
    instead of baking one run's value into a program other runs share."""
    return ml_collections.ConfigDict(json.loads(self.optim_json))


@functools.lru_cache(maxsize=8)
def jitted_step_functions(model: Transformer, settings: StepSettings, mesh):
  """compiled_step_functions jitted over `mesh`: (one step, a group of steps), the same objects
  for equal arguments within a process, so their traces and executables are reused."""
  step_and_accumulate, steps_and_accumulate = compiled_step_functions(settings, model)
  return (jit_over_mesh(step_and_accumulate, mesh, 0),
          jit_over_mesh(steps_and_accumulate, mesh, 1))


def jit_over_mesh(function, mesh, stacked_axes: int, *more_in):
  """`function(state, window, batch, dropout key, length, values, *more)` jitted over `mesh`: the
  batch split over its rows after `stacked_axes` leading axes, the rest and the three outputs
  replicated, the state and window donated. `more_in`: the extra arguments' shardings."""
  replicated = partitioning.replicated(mesh)
  return jax.jit(
      function,
      in_shardings=(replicated, replicated, partitioning.batch_sharded(mesh, stacked_axes),
                    replicated, replicated, replicated, *more_in),
      out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))


def compiled_step_functions(settings: StepSettings, model: Transformer):
  """The functions the loop compiles: one step, and a group of steps in a lax.scan.

  Both take (state, window, batch or [K, ...] batches, dropout key, RunLength, ScheduleValues) and
  return the new state, window and the step number again, as an output of its own that is not
  donated to the next step: the loop waits on it to stay at most one step ahead of the device.
  """
  optim_config = settings.optim_config()

  def step_and_accumulate(state, window, batch, dropout_key, length, values):
    tx_of_length, _ = make_optimizer(optim_config, steps_per_epoch=settings.steps_per_epoch,
                                     total_steps=length, values=values)
    state, metrics = train_state.train_step(state, batch, model=model, tx=tx_of_length,
                                            label_smoothing=settings.label_smoothing,
                                            dropout_key=dropout_key,
                                            microbatch_tokens=settings.microbatch_tokens,
                                            loss_chunk_tokens=settings.loss_chunk_tokens)
    return state, train_state.accumulate_metrics(window, metrics, state.step), state.step + 0

  def steps_and_accumulate(state, window, batches, dropout_key, length, values):
    """step_and_accumulate over batches stacked on a leading axis [K, B, ...], in order."""
    def body(carry, batch):
      state, window, _ = step_and_accumulate(*carry, batch, dropout_key, length, values)
      return (state, window), None

    (state, window), _ = jax.lax.scan(body, (state, window), batches)
    return state, window, state.step + 0

  return step_and_accumulate, steps_and_accumulate


def dropout_key(seed: int):
  """The dropout key of a run of train.seed `seed` (the step and slice are folded in per step)."""
  return jax.random.PRNGKey(seed + 1)


def schedule_values(optim_config: ml_collections.ConfigDict) -> ScheduleValues:
  """The run's peak rate and warmup as the compiled step's float32 arguments."""
  return ScheduleValues(*(jnp.float32(value) for value in ScheduleValues.of(optim_config)))


def batch_shape(local_batch: dict) -> tuple[int, ...]:
  """[B, T, S]: rows, target and source length of a padded batch."""
  return (tuple(local_batch['decoder_input_tokens'].shape)
          + local_batch['encoder_input_tokens'].shape[1:])


def mixed_shapes_notice(shape_batches: dict[tuple, int], steps_per_call: int, members: int,
                        max_length: int) -> str | None:
  """What batches of several shapes cost steps_per_call > 1 and members trained together, or None.

  Args:
    shape_batches: batches an epoch of each [B, L] shape.
    steps_per_call, members: train.steps_per_call, and how many runs train together as members
      (training/members.py).
    max_length: data.max_length, the pack length that puts every pair in one shape.
  """
  shapes = {shape: count for shape, count in shape_batches.items() if count}
  if len(shapes) < 2 or (steps_per_call == 1 and members == 1):
    return None
  main = max(shapes, key=shapes.get)
  costs = []
  if steps_per_call > 1:
    costs.append('a group of train.steps_per_call steps ends at each of them')
  if members > 1:
    costs.append("a step where the members' batches differ in shape trains each member alone")
  return (f'{sum(shapes.values()) - shapes[main]} of the {sum(shapes.values())} batches an epoch '
          f'are not {list(main)}: {" and ".join(costs)}, each shape compiling its own step '
          f'(data.pack_length={max_length} packs every pair into one shape)')


class BatchGroups:
  """The training batches as the loop takes them: up to `steps_per_call` consecutive batches of
  one shape at a time, in the iterator's order.

  A batch of another shape waits for the next group. `get_state` is the iterator's position
  before that waiting batch, so a checkpoint saved after a group resumes at the next batch to
  train. With steps_per_call 1 it is the iterator itself, a batch at a time.
  """

  def __init__(self, iterator, steps_per_call: int):
    self._iterator, self._steps_per_call = iterator, steps_per_call
    self._waiting, self._waiting_from = None, None

  def take(self, at_most: int) -> list[dict]:
    """The next group: min(steps_per_call, at_most) batches, or fewer where the shape changes."""
    if self._steps_per_call == 1:
      return [next(self._iterator)]
    group = []
    while len(group) < min(self._steps_per_call, at_most):
      if self._waiting is None:
        self._waiting_from = self._iterator.get_state()
        self._waiting = next(self._iterator)
      if group and batch_shape(self._waiting) != batch_shape(group[0]):
        break
      group.append(self._waiting)
      self._waiting = None
    return group

  def get_state(self) -> dict:
    return self._iterator.get_state() if self._waiting is None else self._waiting_from

  def set_state(self, state: dict) -> None:
    self._iterator.set_state(state)
    self._waiting = None
