"""Seeds of one config trained together: one compiled step, vmapped over a leading member axis.

`train_seeds_together(config, workdirs, seeds)` trains train.seed = seeds[i] in workdirs[i]. Each
member is an ordinary run: its own initialisation, dropout key and data order (its seed's), its
own run folder with config.json, metrics, validations, checkpoints and status, which it resumes
from alone or in a group. What it shares with the others is the compiled program: parameters,
optimizer state and metric sums stacked along a leading axis [M, ...], and each step's batches
[M, B, ...] (or [M, K, B, ...] with train.steps_per_call K), so that a small model fills an
accelerator that one run leaves idle (docs/performance.md measures whether it pays).

Each member's batches come from its own data order, so at some steps their shapes differ (packed
rows beside a bucket of longer pairs): such a step trains each member alone on its slice of the
stacked state, at the same shapes as a run trained alone. Every member therefore computes what it
would alone, up to the float rounding of a batched product against single ones
(tests/test_members.py states the tolerance).

Not with a time budget (each member would plan its own length) and only with members of one
length; a member that diverges stops alone (its status says so) and the others go on.
"""

import contextlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from training import config_checks, partitioning, run_dir, run_log, stop_signals, train_state
from training import trainer
from training.stepping import TrainStep, batch_shape, compiled_step_functions, dropout_key


def check_members(config: ml_collections.ConfigDict, workdirs: list[str], seeds: list[int]) -> None:
  """One-line refusals of a group that cannot train as one program, before anything is written."""
  if len(seeds) < 2:
    raise ValueError(f'seeds trained together: {len(seeds)} seed given, expected at least 2')
  if len(set(seeds)) != len(seeds) or len(set(workdirs)) != len(workdirs):
    raise ValueError(f'seeds trained together: seeds {seeds} and their run folders must differ')
  if config.train.time_budget_minutes:
    raise ValueError('config.train.time_budget_minutes: seeds trained together need a fixed '
                     'length (0, with train.num_steps), not a time budget each member plans alone')
  if config.train.num_epochs:
    raise ValueError('config.train.num_epochs: seeds trained together need train.num_steps (their '
                     'data orders pack into different numbers of batches per epoch)')
  if config.optim.schedule == 'step':
    raise ValueError("config.optim.schedule: 'step' decays at epochs, whose lengths differ between "
                     "the seeds' data orders; seeds trained together need a schedule in steps")


def member_workdirs(workdir: str, seeds: list[int]) -> list[str]:
  """Each seed's run folder: `workdir` with '{seed}' replaced, or WORKDIR/seed=N without one."""
  if '{seed}' in workdir:
    return [workdir.replace('{seed}', str(seed)) for seed in seeds]
  return [f'{workdir.rstrip("/")}/seed={seed}' for seed in seeds]


def train_seeds_together(config: ml_collections.ConfigDict, workdirs: list[str], seeds: list[int],
                         *, stop_after_steps: int | None = None) -> list[train_state.TrainState]:
  """Trains `config` with train.seed = seeds[i] in workdirs[i], all in one compiled step.

  Raises what train_and_evaluate raises, for the first member concerned; a divergence only once
  every member diverged.

  Returns:
    The final states of the members that did not diverge, in the order of `seeds`.
  """
  check_members(config, workdirs, seeds)
  data = config_checks.check_config(config)
  configs = []
  for seed in seeds:
    member_config = ml_collections.ConfigDict(config.to_dict())
    member_config.train.seed = seed
    configs.append(member_config)
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
                                    label=f'seed {seeds[index]}: ', draws_bar=index == 0))
      trainer.say_mixed_shapes(runs[0], seeds=len(seeds),
                               say=console.line if console else lambda text: None)
      return _Group(runs, seeds, console).train(stop_after_steps)
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


class MemberStep(TrainStep):
  """TrainStep over members: the vmapped step for batches of one shape, and one member's step on
  its slice of the stacked state for a step whose members' batches differ in shape."""

  def __init__(self, config: ml_collections.ConfigDict, run: 'trainer.Run', seeds: list[int],
               mesh, clocks):
    """`run`: any member (its model, step counts and slicing); `clocks`: what compiling pauses."""
    self._mesh, self._clock = mesh, clocks
    replicated = partitioning.replicated(mesh)
    self._dropout_key = jax.jit(lambda: jnp.stack([dropout_key(seed) for seed in seeds]),
                                out_shardings=replicated)()  # [M, 2]
    self.microbatch_tokens = run.train_step.microbatch_tokens
    self.steps_per_call = config.train.steps_per_call
    self.new_window = run.train_step.new_window
    self.compile_seconds: dict[tuple, float] = {}
    self._previous_step_done = None
    step, steps = compiled_step_functions(config, run.model, run.steps, self.microbatch_tokens)

    def one_member(states, windows, batch, keys, length, index):
      state, window, step_done = step(_take(states, index), _take(windows, index), batch,
                                      keys[index], length)
      put = lambda stacked, one: jax.tree.map(lambda s, o: s.at[index].set(o), stacked, one)
      return put(states, state), put(windows, window), step_done

    def jitted(function, stacked_axes: int, *more_in):
      return jax.jit(function, in_shardings=(
          replicated, replicated, partitioning.batch_sharded(mesh, stacked_axes), replicated,
          replicated, *more_in), out_shardings=(replicated,) * 3, donate_argnums=(0, 1))

    members = lambda function: jax.vmap(function, in_axes=(0, 0, 0, 0, None))
    self._jitted_members = jitted(members(step), 1)
    self._jitted_member_groups = jitted(members(steps), 2)
    self._jitted_one = jitted(one_member, 0, replicated)

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
                            ('seeds', *np.shape(stacked['decoder_input_tokens']),
                             stacked['encoder_input_tokens'].shape[-1]), length)
    for at in range(steps):
      batches = [member[at] for member in member_batches]
      if len({batch_shape(batch) for batch in batches}) == 1:
        stacked = {name: np.stack([batch[name] for batch in batches]) for name in batches[0]}
        states, windows = self._dispatch(
            self._jitted_members, states, windows,
            partitioning.global_batch(stacked, self._mesh, stacked_axes=1),
            ('seeds', len(batches), *batch_shape(batches[0])), length)
        continue
      for index, batch in enumerate(batches):
        states, windows = self._dispatch(
            self._jitted_one, states, windows, partitioning.global_batch(batch, self._mesh),
            ('one seed', *batch_shape(batch)), length, np.int32(index))
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

  def __init__(self, runs: list, seeds: list[int], console):
    steps = {run.progress.step for run in runs}
    if len(steps) > 1:
      raise ValueError(f'seeds trained together resume at one step; seeds {seeds} are at steps '
                       f'{[run.progress.step for run in runs]} (train them apart to one step)')
    self.runs, self.seeds, self.console = runs, list(seeds), console
    self.runs_at_start = list(runs)
    self.clocks = _Clocks(runs)
    self.mesh = partitioning.make_mesh()
    self.step = MemberStep(runs[0].config, runs[0], seeds, self.mesh, self.clocks)
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
      self.seeds = [self.seeds[index] for index in kept]
      if not self.runs:
        raise run_log.DivergenceError(self.runs_at_start[-1].progress.step,
                                      'every seed trained together diverged')
      self.clocks.runs = self.runs
      self.step = MemberStep(self.runs[0].config, self.runs[0], self.seeds, self.mesh, self.clocks)
      self.states = jax.jit(lambda states: _take(states, np.array(kept)))(self.states)
    self.windows = self.stack([run.window.sums for run in self.runs])


def _at_a_pause(run) -> bool:
  """Whether any of the run's periodic actions acts after this step."""
  progress = run.progress
  return progress.at_end or any(progress.step % every == 0 for every in (
      run.report.every, run.validation.every, run.checkpointing.every))
