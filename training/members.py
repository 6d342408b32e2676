"""Members trained together: one compiled step, vmapped over a leading member axis.

The members are runs of one config that differ only in `MEMBER_FIELDS`: the seed, the peak rate
and the warmup, which enter the compiled step as arguments (the dropout key and
`optimizer.ScheduleValues`), not as constants. `train_members(config, workdirs, members)` trains
member i, the config with members[i]'s values, in workdirs[i]. Each member is an ordinary run:
its own initialisation, dropout key and data order (its seed's) and learning rates, its own run
folder with config.json, metrics, validations, checkpoints and status, which it resumes from alone
or in a group. What it shares with the others is the compiled program: parameters, optimizer
state and metric sums stacked along a leading axis [M, ...], and each step's batches [M, B, ...]
(or [M, K, B, ...] with train.steps_per_call K), so that a small model fills an accelerator that
one run leaves idle (docs/performance.md measures whether it pays).

Each member's batches come from its own data order, so at some steps their shapes differ (packed
rows beside a bucket of longer pairs): such a step trains each member alone on its slice of the
stacked state, at the same shapes as a run trained alone. Every member therefore computes what it
would alone, up to the float rounding of a batched product against single ones
(tests/test_members.py states the tolerance).

Not with a time budget (each member would plan its own length) and only with members of one
length; a member that diverges stops alone (its status says so) and the others go on.
"""

import contextlib
import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from model.transformer import Transformer
from training import config_checks, partitioning, run_dir, run_log, stop_signals, train_state
from training import trainer
from training.member_fields import MEMBER_FIELDS
from training.stepping import StepSettings, TrainStep, batch_shape, compiled_step_functions
from training.stepping import dropout_key, jit_over_mesh, schedule_values


def parse_members(seeds: list[str], varied: list[str]) -> list[dict[str, str]]:
  """The members train.py's --seeds and --vary ask for: each member's fields as their text.

  Args:
    seeds: --seeds, e.g. ['0', '1', '2']: every member below once per seed.
    varied: --vary values 'KEY=V1,V2,...', each KEY one of MEMBER_FIELDS and each list one value
      per member (zipped, so that any set of points can train together).

  Raises:
    ValueError: one line naming the flag and what was expected.
  """
  lists = {}
  for text in varied:
    key, equals, values = text.partition('=')
    if not equals or not values:
      raise ValueError(f'--vary={text}: expected KEY=V1,V2,... e.g. --vary=optim.learning_rate='
                       '5e-4,1e-3')
    if key not in MEMBER_FIELDS or key in lists:
      raise ValueError(f'--vary={text}: {key} is not one of {", ".join(MEMBER_FIELDS)}, once each '
                       '(the fields that enter the compiled step as arguments)')
    lists[key] = values.split(',')
  if len({len(values) for values in lists.values()}) > 1:
    raise ValueError(f'--vary: the lists give one value per member, so they must be equally long, '
                     f'not {", ".join(f"{key}: {len(values)}" for key, values in lists.items())}')
  if seeds and 'train.seed' in lists:
    raise ValueError('--seeds and --vary=train.seed both set the seeds; give one')
  points = [dict(zip(lists, values)) for values in zip(*lists.values())] or [{}]
  if not seeds:
    return points
  return [{**point, 'train.seed': seed} for point in points for seed in seeds]


def member_configs(config: ml_collections.ConfigDict,
                   members: list[dict[str, str]]) -> list[ml_collections.ConfigDict]:
  """`config` with each member's values, parsed as the field's type."""
  configs = []
  for member in members:
    member_config = ml_collections.ConfigDict(config.to_dict())
    for key, text in member.items():
      section, name = key.split('.')
      kind = type(config[section][name])
      try:
        member_config[section][name] = kind(text)
      except ValueError:
        raise ValueError(f'{key}={text}: expected a value of type {kind.__name__}') from None
    configs.append(member_config)
  return configs


def member_workdirs(workdir: str, members: list[dict[str, str]]) -> list[str]:
  """Each member's run folder: `workdir` with '{seed}' and '{KEY}' (each varied field's) replaced
  by the member's text, or WORKDIR/learning_rate=V,...,seed=N without a '{'."""
  varied = _varied(members)
  placeholder = lambda key: '{seed}' if key == 'train.seed' else '{' + key + '}'
  if '{' not in workdir:
    return [f'{workdir.rstrip("/")}/' + ','.join(f'{MEMBER_FIELDS[key]}={member[key]}'
                                                  for key in varied) for member in members]
  for key in varied:
    if placeholder(key) not in workdir:
      raise ValueError(f'--workdir={workdir}: the members differ in {key}, so it needs '
                       f'{placeholder(key)} (or no placeholder at all)')
  folders = []
  for member in members:
    folder = workdir
    for key, text in member.items():
      folder = folder.replace(placeholder(key), text)
    folders.append(folder)
  return folders


def _varied(members: list[dict[str, str]]) -> list[str]:
  """The fields whose values differ between members, in MEMBER_FIELDS' order."""
  return [key for key in MEMBER_FIELDS if len({member.get(key) for member in members}) > 1]


def check_members(config: ml_collections.ConfigDict, workdirs: list[str],
                  members: list[dict[str, str]]) -> None:
  """One-line refusals of a group that cannot train as one program, before anything is written."""
  if len(members) < 2:
    raise ValueError(f'members trained together: {len(members)} given, expected at least 2')
  if (len({tuple(sorted(member.items())) for member in members}) != len(members)
      or len(set(workdirs)) != len(workdirs)):
    raise ValueError(f'members trained together: {members} and their run folders must differ')
  unknown = {key for member in members for key in member} - set(MEMBER_FIELDS)
  if unknown:
    raise ValueError(f'members trained together differ only in {", ".join(MEMBER_FIELDS)}, not '
                     f'{", ".join(sorted(unknown))}')
  if config.train.time_budget_minutes:
    raise ValueError('config.train.time_budget_minutes: members trained together need a fixed '
                     'length (0, with train.num_steps), not a time budget each member plans alone')
  if config.train.num_epochs:
    raise ValueError('config.train.num_epochs: members trained together need train.num_steps '
                     '(their data orders pack into different numbers of batches per epoch)')
  if config.optim.schedule == 'step':
    raise ValueError("config.optim.schedule: 'step' decays at epochs, whose lengths differ between "
                     "the seeds' data orders; members trained together need a schedule in steps")


def train_members(config: ml_collections.ConfigDict, workdirs: list[str],
                  members: list[dict[str, str]], *,
                  stop_after_steps: int | None = None) -> list[train_state.TrainState]:
  """Trains `config` with members[i]'s values in workdirs[i], all in one compiled step.

  Raises what train_and_evaluate raises, for the first member concerned; a divergence only once
  every member diverged.

  Returns:
    The final states of the members that did not diverge, in the order of `members`.
  """
  check_members(config, workdirs, members)
  configs = member_configs(config, members)
  data = config_checks.check_config(config)
  for member_config in configs:
    config_checks.check_config(member_config)
  labels = [', '.join(f'{MEMBER_FIELDS[key]} {member[key]}' for key in _varied(members))
            for member in members]
  with contextlib.ExitStack() as claims:
    first_starts, changes = [], []
    for member_config, workdir in zip(configs, workdirs):
      run_dir.make_run_folder(workdir)
      claims.enter_context(run_dir.claim_run_folder(workdir))
      changes.append(run_dir.check_resume(workdir, member_config))
      run_dir.check_source(workdir, data.fingerprint)
      first_starts.append(not run_dir.path(workdir, run_dir.CONFIG_FILE).exists())
    runs = []
    try:
      console = run_log.Console() if jax.process_index() == 0 else None
      for index, (member_config, workdir) in enumerate(zip(configs, workdirs)):
        runs.append(trainer.set_up(member_config, data, workdir, changes[index], console=console,
                                    label=f'{labels[index]}: ',
                                    draws_bar=index == 0))
      trainer.say_mixed_shapes(runs[0], members=len(members),
                               say=console.line if console else lambda text: None)
      return _Group(runs, console).train(stop_after_steps)
    except BaseException:
      for index, workdir in enumerate(workdirs):
        started = index < len(runs) and runs[index].progress.steps_this_run
        if first_starts[index] and not started and jax.process_index() == 0:
          run_dir.undo_failed_start(workdir)
      raise


def _stack(trees):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _take(tree, index):
  return jax.tree.map(lambda leaf: leaf[index], tree)


@functools.lru_cache(maxsize=8)
def jitted_member_steps(model: Transformer, settings: StepSettings, mesh):
  """The members' compiled steps over `mesh`: (the vmapped step, the vmapped group of steps, one
  member's step on its slice of the stacked state), the same objects for equal arguments within a
  process, as stepping.jitted_step_functions."""
  step, steps = compiled_step_functions(settings, model)

  def one_member(states, windows, batch, keys, length, values, index):
    state, window, step_done = step(_take(states, index), _take(windows, index), batch,
                                    keys[index], length, _take(values, index))
    put = lambda stacked, one: jax.tree.map(lambda s, o: s.at[index].set(o), stacked, one)
    return put(states, state), put(windows, window), step_done

  members = lambda function: jax.vmap(function, in_axes=(0, 0, 0, 0, None, 0))
  return (jit_over_mesh(members(step), mesh, 1), jit_over_mesh(members(steps), mesh, 2),
          jit_over_mesh(one_member, mesh, 0, partitioning.replicated(mesh)))


class MemberStep(TrainStep):
  """TrainStep over members: the vmapped step for batches of one shape, and one member's step on
  its slice of the stacked state for a step whose members' batches differ in shape."""

  def __init__(self, configs: list[ml_collections.ConfigDict], run: 'trainer.Run', mesh, clocks):
    """`configs`: the members'; `run`: any member (its model, step counts and slicing); `clocks`:
    what compiling pauses."""
    self._mesh, self._clock = mesh, clocks
    replicated = partitioning.replicated(mesh)
    self._dropout_key = jax.jit(lambda: jnp.stack([dropout_key(config.train.seed)
                                                   for config in configs]),
                                out_shardings=replicated)()  # [M, 2]
    self._schedule_values = jax.jit(lambda: _stack([schedule_values(config.optim)
                                                    for config in configs]),
                                    out_shardings=replicated)()  # [M] each
    config = configs[0]
    self.microbatch_tokens = run.train_step.microbatch_tokens
    self.steps_per_call = config.train.steps_per_call
    self.new_window = run.train_step.new_window
    self.compile_seconds: dict[tuple, float] = {}
    self._previous_step_done = None
    self._jitted_members, self._jitted_member_groups, self._jitted_one = jitted_member_steps(
        run.model, StepSettings.of(config, run.steps, self.microbatch_tokens), mesh)

  def train(self, states, windows, member_batches: list[list[dict]], length):
    """Trains each member's batches (member_batches[i]: its next n, in order); returns the stacked
    states and windows."""
    steps = len(member_batches[0])
    shapes = {batch_shape(batch) for batches in member_batches for batch in batches}
    if steps == self.steps_per_call > 1 and len(shapes) == 1:
      stacked = {name: np.stack([np.stack([batch[name] for batch in batches])
                                 for batches in member_batches]) for name in member_batches[0][0]}
      return self._dispatch(self._jitted_member_groups, states, windows,
                            partitioning.global_batch(stacked, self._mesh, stacked_axes=2),
                            ('members', *np.shape(stacked['decoder_input_tokens']),
                             stacked['encoder_input_tokens'].shape[-1]), length)
    for at in range(steps):
      batches = [member[at] for member in member_batches]
      if len({batch_shape(batch) for batch in batches}) == 1:
        stacked = {name: np.stack([batch[name] for batch in batches]) for name in batches[0]}
        states, windows = self._dispatch(
            self._jitted_members, states, windows,
            partitioning.global_batch(stacked, self._mesh, stacked_axes=1),
            ('members', len(batches), *batch_shape(batches[0])), length)
        continue
      for index, batch in enumerate(batches):
        states, windows = self._dispatch(
            self._jitted_one, states, windows, partitioning.global_batch(batch, self._mesh),
            ('one member', *batch_shape(batch)), length, np.int32(index))
    return states, windows


class _Clocks:
  """The members' clocks, paused together: a compilation stops every member's training time."""

  def __init__(self, runs):
    self.runs = runs

  def pause(self, seconds: float) -> None:
    for run in self.runs:
      run.clock.pause(seconds)


class _Group:
  """The loop of trainer._train, over members: the stacked state steps; at a pause each member's
  slice goes to its own periodic actions, and the time one member's actions take is left out of
  the others' training time too."""

  def __init__(self, runs: list, console):
    steps = {run.progress.step for run in runs}
    if len(steps) > 1:
      raise ValueError(f'members trained together resume at one step; '
                       f'{[run.workdir for run in runs]} are at steps '
                       f'{[run.progress.step for run in runs]} (train them apart to one step)')
    self.runs, self.console = runs, console
    self.runs_at_start = list(runs)
    self.profiling = runs[0].profiling  # one program: its trace goes to the first member's folder
    self.clocks = _Clocks(runs)
    self.mesh = partitioning.make_mesh()
    self.step = MemberStep([run.config for run in runs], runs[0], self.mesh, self.clocks)
    self.stack = jax.jit(_stack, out_shardings=partitioning.replicated(self.mesh))
    self.states = self.stack([run.state for run in runs])
    self.windows = self.stack([run.window.sums for run in runs])
    for run in runs:
      run.state = None  # the stacked copy is the state now

  def train(self, stop_after_steps: int | None) -> list[train_state.TrainState]:
    signals = stop_signals.StopSignals(multiprocess=jax.process_count() > 1,
                                       say=self.console.line if self.console else None)
    signals.install()
    try:
      while self.runs and self.runs[0].progress.step < self.runs[0].progress.total_steps:
        lead = self.runs[0]
        self.profiling.before_steps(lead.progress.step, self.states)
        steps = min(self.step.steps_per_call, trainer.steps_before_a_pause(lead, stop_after_steps))
        member_batches = [[next(run.train_iter) for _ in range(steps)] for run in self.runs]
        for run, batches in zip(self.runs, member_batches):
          run.epochs.before_steps(run.progress, [int(batch.pop('epoch')) for batch in batches])
        self.states, self.windows = self.step.train(self.states, self.windows, member_batches,
                                                     lead.schedule.argument)
        if len(self.step.compile_seconds) != len(lead.train_step.compile_seconds):
          for run in self.runs:  # what each member's records count as compiled
            run.train_step.compile_seconds.update(self.step.compile_seconds)
        for run in self.runs:
          run.progress.step += steps
          run.progress.steps_this_run += steps
        self.profiling.after_steps(lead.progress, self.states)
        signum = signals.requested(lead.progress.step)
        if _at_a_pause(lead) or signum is not None or stop_after_steps is not None:
          self._act(signum)
          if stop_after_steps is not None and lead.progress.steps_this_run >= stop_after_steps:
            for run in self.runs:
              run.checkpointer.wait_until_finished()
            return [_take(self.states, index) for index in range(len(self.runs))]
      for run in self.runs:
        trainer.close_records(run)
    finally:
      signals.uninstall()
      self.profiling.close(self.runs_at_start[0].progress.step)
      for run in self.runs:
        run.checkpointer.close()
        run.writer.close()
      if self.console:
        self.console.close()
    for run in self.runs:
      trainer.write_status(run, 'finished', step=run.progress.step)
      run.say(f'finished at step {run.progress.step} in '
              f'{run.clock.invocation_seconds() / 60:.1f} min; run folder {run.workdir}')
    return [_take(self.states, index) for index in range(len(self.runs))]

  def _act(self, signum: int | None) -> None:
    """Each member's periodic actions on its slice; a divergence drops that member."""
    diverged = []
    for index, run in enumerate(self.runs):
      start = time.perf_counter()
      run.window.sums = _take(self.windows, index)
      state = _take(self.states, index)
      try:
        run.report(run.progress)
        trainer.validate_and_save(run, state)
        if signum is not None and not run.progress.at_end:
          run.checkpointing.save_on_stop(run.progress, state, run.window)
      except run_log.DivergenceError as error:
        trainer.write_status(run, 'diverged', step=error.step, message=str(error))
        run.say(f'diverged: {error}')
        run.checkpointer.close()
        run.writer.close()
        diverged.append(index)
      except BaseException as error:
        trainer.write_status(run, 'failed', step=run.progress.step,
                              message=f'{type(error).__name__}: {error}')
        raise
      seconds = time.perf_counter() - start
      for other in self.runs:
        if other is not run:
          other.clock.pause(seconds)
    if signum is not None:
      stopped = stop_signals.RunStopped(signum, self.runs[0].progress.step, saved=True)
      for run in self.runs:
        trainer.write_status(run, 'stopped', step=run.progress.step, message=str(stopped))
      raise stopped
    kept = [index for index in range(len(self.runs)) if index not in diverged]
    if diverged:
      self.runs = [self.runs[index] for index in kept]
      if not self.runs:
        raise run_log.DivergenceError(self.runs_at_start[-1].progress.step,
                                      'every member trained together diverged')
      self.clocks.runs = self.runs
      self.step = MemberStep([run.config for run in self.runs], self.runs[0], self.mesh,
                             self.clocks)
      self.states = jax.jit(lambda states: _take(states, np.array(kept)))(self.states)
    self.windows = self.stack([run.window.sums for run in self.runs])


def _at_a_pause(run) -> bool:
  """Whether any of the run's periodic actions acts after this step."""
  progress = run.progress
  return progress.at_end or any(progress.step % every == 0 for every in (
      run.report.every, run.validation.every, run.checkpointing.every))
