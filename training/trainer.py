"""The training loop: `train_and_evaluate(config, workdir)`, which train.py runs.

Re-running on an existing workdir resumes from its latest intact checkpoint (params, optimizer
state, step, data-iterator position and the metric sums of the steps not yet recorded; dropout keys
derive from the step). What the workdir holds is training/run_dir.py's to say.

The loop dispatches a step and hands it to the periodic actions (training/periodic_actions.py):
each owns its cadence and its state. A budgeted run's plans are time_budget.BudgetKeeper's.
"""

import dataclasses
import functools
import math
import time
from collections.abc import Callable

from absl import logging
import jax
import ml_collections
from jax.experimental import multihost_utils

from data import datasets, pipeline
from evaluation.validation import Evaluator
from model.transformer import Transformer
from training import (config_checks, partitioning, periodic_actions as actions, run_dir, run_log,
                      run_summary, stop_signals, time_budget, train_state)
from training.checkpointing import Checkpointer
from training.optimizer import RunLength, make_optimizer
from training.stepping import BatchGroups, RunSteps, Schedule, TrainStep, mixed_shapes_notice


# One jitted function for every run in a process: a run of an equal model reuses its traces.
_jitted_eval_step = jax.jit(train_state.eval_step, static_argnames='model')


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: int | None = None) -> train_state.TrainState:
  """Trains to config.train.num_steps (or num_epochs, or the fewer steps that fit
  train.time_budget_minutes), resuming from `workdir` if it has checkpoints.

  Before anything is written: the config is checked, the run folder locked (one process group
  trains a run at a time) and, on resume, the config compared with the run's config.json. A first
  start that fails before its first step removes what it wrote (run_dir.undo_failed_start).

  Args:
    config: the full experiment config (configs/base.py fields).
    workdir: run directory.
    stop_after_steps: leave after this many steps of this invocation without a final save, as a
      killed run would (tests of exact resumption).

  Returns:
    The final train state.

  Raises:
    ValueError: a bad config field (one line).
    run_dir.RunFolderError: the folder is a file or unwritable, locked by another run, or holds a
      run of another config.
    training.checkpointing.CheckpointError: no checkpoint of the run can be restored.
    run_log.DivergenceError: the run diverged (status.json says so).
    stop_signals.RunStopped: SIGTERM or SIGINT stopped the run after saving (status `stopped`).
  """
  data = config_checks.check_config(config)
  run_dir.make_run_folder(workdir)
  with run_dir.claim_run_folder(workdir):
    changes = run_dir.check_resume(workdir, config)
    run_dir.check_source(workdir, data.fingerprint)
    first_start = not run_dir.path(workdir, run_dir.CONFIG_FILE).exists()
    run = None
    try:
      run = set_up(config, data, workdir, changes)
      say_mixed_shapes(run, members=1, say=run.say)
      return _train(run, stop_after_steps)
    except BaseException:
      if first_start and (run is None or not run.progress.steps_this_run) and (
          jax.process_index() == 0):
        run_dir.undo_failed_start(workdir)
      raise


@dataclasses.dataclass
class Run:
  """What the loop works with, made once by `set_up` (and `_restore` on resume)."""
  config: ml_collections.ConfigDict
  workdir: str
  is_primary: bool
  console: run_log.Console | None
  say: Callable[[str], None]  # prints one console line on process 0
  train_iter: pipeline.TrainIterator
  batches: BatchGroups
  model: Transformer
  steps: RunSteps
  state: train_state.TrainState
  checkpointer: Checkpointer
  writer: run_log.MetricsWriter
  progress: actions.Progress
  clock: actions.Clock
  window: actions.MetricsWindow
  schedule: Schedule
  train_step: TrainStep
  budget: time_budget.BudgetKeeper
  eta: actions.Eta
  report: actions.MetricsReport
  validation: actions.Validation
  checkpointing: actions.Checkpointing
  epochs: actions.EpochClock
  profiling: actions.Profiling


def _train(run: Run, stop_after_steps: int | None) -> train_state.TrainState:
  """The loop: step, then hand the step to the periodic actions, until the run's last step."""
  progress, state = run.progress, run.state
  # From here on SIGTERM and SIGINT stop the run at the end of a step (before, they end it at once).
  signals = stop_signals.StopSignals(multiprocess=jax.process_count() > 1,
                                     say=run.console.line if run.console else None)
  signals.install()
  try:
    while progress.step < progress.total_steps:
      run.profiling.before_steps(progress.step, state)
      batches = run.batches.take(steps_before_a_pause(run, stop_after_steps))
      run.epochs.before_steps(progress, [int(batch.pop('epoch')) for batch in batches])
      state, run.window.sums = run.train_step(state, run.window.sums, batches, run.schedule.argument)
      progress.step += len(batches)
      progress.steps_this_run += len(batches)
      run.profiling.after_steps(progress, state)
      run.budget.ends_early(progress, run.clock, run.schedule)
      run.report(progress)
      run.budget.after_report(progress.step, run.clock.paused)
      validate_and_save(run, state)
      if stop_after_steps is not None and progress.steps_this_run >= stop_after_steps:
        run.checkpointer.wait_until_finished()
        return state
      signum = signals.requested(progress.step)
      if signum is not None and not progress.at_end:
        saved = run.checkpointing.save_on_stop(progress, state, run.window)
        raise stop_signals.RunStopped(signum, progress.step, saved=saved)
    close_records(run)
  except run_log.DivergenceError as error:
    logging.info('%s', error)  # train.log; train.py prints it once
    write_status(run, 'diverged', step=error.step, message=str(error))
    raise
  except stop_signals.RunStopped as stopped:
    write_status(run, 'stopped', step=stopped.step, message=str(stopped))
    raise
  except BaseException as error:
    write_status(run, 'failed', step=progress.step, message=f'{type(error).__name__}: {error}')
    raise
  finally:
    signals.uninstall()
    run.profiling.close(progress.step)
    run.checkpointer.close()
    run.writer.close()
    if run.console:
      run.console.close()
  write_status(run, 'finished', step=progress.step)
  best_step = run.checkpointer.best_step()
  minutes = run.config.train.time_budget_minutes
  run.say(f'finished at step {progress.step} in {run.clock.invocation_seconds() / 60:.1f} min'
          + (f' (time budget {minutes} min)' if minutes else '') + f'; run folder {run.workdir}'
          + (f', best checkpoint step {best_step}' if best_step is not None else ''))
  return state


def close_records(run: Run) -> None:
  """At the loop's end: the record of the steps after the last one, and of the epoch that the
  last step finished."""
  run.window.settle()
  if run.progress.step % run.train_iter.batches_per_epoch == 0:
    run.epochs.finish(run.progress)


def steps_before_a_pause(run: Run, stop_after_steps: int | None) -> int:
  """Steps to the next one after which the loop must act (a record, validation, checkpoint, time
  budget plan, profile, the run's end), so that a group of steps in one dispatch never passes it."""
  progress = run.progress
  steps = progress.total_steps - progress.step
  for every in (run.report.every, run.validation.every, run.checkpointing.every):
    steps = min(steps, every - progress.step % every)
  if run.budget.plan_at and run.budget.plan_at > progress.step:
    steps = min(steps, run.budget.plan_at - progress.step)
  if stop_after_steps is not None:
    steps = min(steps, stop_after_steps - progress.steps_this_run)
  profile_at = run.profiling.next_at(progress.step)
  if profile_at is not None:
    steps = min(steps, profile_at - progress.step)
  return steps


def validate_and_save(run: Run, state: train_state.TrainState) -> None:
  """The pause after a step: validation, a budget's plan and a checkpoint, where each is due.

  A budgeted run validates and saves at the end of warmup as well, to time both for its first plan;
  a later plan comes after a validation and before the checkpoint, so a run resumed from that
  checkpoint plans alike. None of it counts as training time.
  """
  progress, budget, clock = run.progress, run.budget, run.clock
  step, plan_at = progress.step, budget.plan_at
  pause_start = time.perf_counter()
  validated = None
  if run.validation.due(progress, also_at=plan_at):
    validated = run.validation(progress, state, run.window)
  save_due = run.checkpointing.due(progress, also_at=plan_at)
  replan = budget.replans_after(progress, validated is not None)
  moved = False
  if replan:
    save_seconds = budget.plan.costs.save_seconds
    moved = budget.make_plan(step, clock=pause_start, paused=clock.paused,
                             elapsed_seconds=clock.run_seconds() + save_due * save_seconds,
                             eval_seconds=validated.seconds, save_seconds=save_seconds)
  if save_due:
    sums = run.window.settle()
    save_seconds = run.checkpointing.save(
        progress, state, sums, clock.window_seconds(until=pause_start),
        {'val_loss': validated.metrics['eval_loss']} if validated else None,
        force=progress.at_end or step == plan_at)
  if step == plan_at:
    moved = budget.make_plan(step, clock=pause_start, paused=clock.paused,
                             elapsed_seconds=clock.run_seconds(), eval_seconds=validated.seconds,
                             save_seconds=save_seconds,
                             extra={'eval_compile_seconds': validated.compile_seconds})
  if moved:
    progress.total_steps = budget.plan.end_step
    run.schedule.set(budget.plan.length)
    if run.console:
      run.console.set_total(progress.total_steps)
  clock.pause(time.perf_counter() - pause_start)
  if replan or step == plan_at:
    budget.plan.start_timing(step, time.perf_counter(), clock.paused)
  if validated:
    run.eta.validation_seconds = validated.seconds
  if save_due:
    run.eta.save_seconds = save_seconds


def write_status(run: Run, state: str, **fields) -> None:
  if run.is_primary:
    run_log.write_status(run.workdir, state, **fields)


def set_up(config: ml_collections.ConfigDict, data: datasets.DataSpec, workdir: str,
            changes: dict, *, console: run_log.Console | None = None, label: str = '',
            draws_bar: bool = True) -> Run:
  """Writes the run's config, prepares data, model and state (restored if the run has checkpoints),
  and makes the periodic actions; says what it made.

  A run of seeds trained together (training/members.py) prints through the group's `console`, its
  lines after `label`; one of them `draws_bar`.
  """
  run_start = time.perf_counter()
  is_primary = jax.process_index() == 0
  if console is None and is_primary:
    console = run_log.Console()
  say = (lambda text: console.line(label + text)) if console else lambda text: None
  bar = console if draws_bar else None
  if is_primary:
    for name, (old, new) in changes.items():
      if old is not None:  # not a field added to the code since the run started
        say(f'{name} changed from {old!r} to {new!r} since this run started')
    run_dir.write_config(workdir, config)
    run_dir.write_source(workdir, data.fingerprint)
    logging.info('config:\n%s', config)

  checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints,
                              save_every=config.train.checkpoint_every)

  say('preparing data and vocabularies (minutes on a dataset\'s first use, then cached)')
  vocabularies = run_dir.load_run_vocabularies(workdir, data)
  train_iter = pipeline.make_train_iterator(
      data, vocabularies, seed=config.train.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), batch_multiple=jax.local_device_count())
  batches = BatchGroups(train_iter, config.train.steps_per_call)
  steps = RunSteps.of(config.train, train_iter.batches_per_epoch)
  max_steps = steps.max_steps
  model = Transformer.of(config.model, vocabularies.source.vocab_size,
                         vocabularies.target.vocab_size)
  mesh = partitioning.make_mesh()
  # The optimizer state's structure does not depend on the run's length (the step's argument).
  tx, _ = make_optimizer(config.optim, steps_per_epoch=steps.steps_per_epoch, total_steps=max_steps)
  state = train_state.create_train_state(model, tx, config.train.seed, mesh)
  latest, state, resumed = _restore(checkpointer, state, batches, say, is_primary)
  step = int(state.step)
  writer = run_log.MetricsWriter(workdir, is_primary=is_primary, start_step=step)

  budget = _budget_keeper(config, max_steps, step, writer, say, is_primary)
  plan = budget.plan
  total_steps = min(max_steps, plan.end_step) if plan.planned else max_steps
  saved_window = resumed.get('metrics_window')
  clock = actions.Clock(run_start, resumed.get('run_seconds', 0.0))  # {} for a new run
  schedule = Schedule(config.optim, steps, mesh, plan.length or RunLength.fixed(total_steps))
  train_step = TrainStep(config, model, mesh, steps, clock)
  say(run_summary.describe_data(data, train_iter, vocabularies))
  length = (f'up to {max_steps} steps, as many as fit {config.train.time_budget_minutes} min '
            f'(planned at step {budget.plan_at})' if budget.plan_at else f'{total_steps} steps')
  say(run_summary.describe_model(model, state.params, length, latest, train_step.microbatch_tokens))
  # The steps after the last record, trained before the checkpoint: the next record covers them
  # as an uninterrupted run's does.
  window = actions.MetricsWindow(train_step.new_window, saved_window and saved_window['sums'],
                                 replicated=partitioning.replicated(mesh))
  evaluator = Evaluator(data, vocabularies, model, mesh,
                        functools.partial(_jitted_eval_step, model=model))

  loss_watch = run_log.LossWatch(
      ceiling=config.train.divergence_loss_ceiling, growth=config.train.divergence_growth,
      lowest=min((record['train_loss'] for record in writer.previous_records
                  if 'train_loss' in record), default=math.inf))
  progress = actions.Progress(step=step, total_steps=total_steps)
  if is_primary:
    run_log.write_status(workdir, 'running', step=step)
  if bar:
    bar.start(None if budget.plan_at else total_steps, initial_step=step)
  clock.new_window(saved_window['seconds'] if saved_window else 0.0)
  budget.start(step, clock.paused)
  eta = actions.Eta(clock, eval_every=config.train.eval_every,
                    checkpoint_every=config.train.checkpoint_every)
  return Run(
      config=config, workdir=workdir, is_primary=is_primary, console=bar, say=say,
      train_iter=train_iter, batches=batches, model=model, steps=steps, state=state,
      checkpointer=checkpointer, writer=writer,
      progress=progress, clock=clock, window=window, schedule=schedule, train_step=train_step,
      budget=budget, eta=eta,
      report=actions.MetricsReport(
          log_every=config.train.log_every, writer=writer, console=bar, loss_watch=loss_watch,
          window=window, clock=clock, compile_seconds=train_step.compile_seconds,
          schedule=schedule, eta=eta,
          status=lambda at: run_log.write_status(workdir, 'running', step=at) if is_primary else None),
      validation=actions.Validation(every=config.train.eval_every, evaluator=evaluator,
                                    writer=writer, say=say,
                                    earlier_records=writer.previous_records),
      checkpointing=actions.Checkpointing(
          every=config.train.checkpoint_every, save_on_stop_after=config.train.save_on_stop_after,
          checkpointer=checkpointer, train_iter=batches, clock=clock, last_saved=latest or 0),
      epochs=actions.EpochClock(writer, steps.steps_per_epoch),
      profiling=actions.Profiling(
          steps=config.train.profile_steps, log_every=config.train.log_every, start_step=step,
          folder=str(run_dir.path(workdir, run_dir.PROFILE_DIR)), clock=clock, say=say))


def _budget_keeper(config: ml_collections.ConfigDict, max_steps: int, step: int,
                   writer: run_log.MetricsWriter, say, is_primary: bool) -> time_budget.BudgetKeeper:
  """A budgeted run's plans, the latest one read back on resume (process 0 reads the records; only
  its clock decides when to stop early)."""
  plan = time_budget.BudgetPlan.of(config.train, max_steps)
  if config.train.time_budget_minutes:
    plan.resume(writer.previous_records if is_primary else [])
    plan.agree(partitioning.agreed_numbers)
  return time_budget.BudgetKeeper(
      plan, budget_minutes=config.train.time_budget_minutes,
      warmup_steps=config.optim.warmup_steps, log_every=config.train.log_every, start_step=step,
      writer=writer, say=say, is_primary=is_primary, agreed=partitioning.agreed)


def _restore(checkpointer: Checkpointer, state: train_state.TrainState, batches: BatchGroups, say,
             is_primary: bool) -> tuple[int | None, train_state.TrainState, dict]:
  """Restores the newest intact checkpoint, if any, and the data position saved with it.

  Returns (its step or None, the state, what was saved beside the state). Newer checkpoints that
  failed to restore are set aside, so this run can save those steps anew.
  """
  if not checkpointer.all_steps():
    return None, state, {}
  latest, state, extra = checkpointer.restore_newest_intact(
      state, on_damaged=lambda error: say(f'{error}; trying the next older checkpoint'))
  extra = actions.upgrade_resume_data(extra)
  batches.set_state(extra['data_iterator'])
  logging.info('resumed from step %d', latest)
  for damaged in [step for step in checkpointer.all_steps() if step > latest]:
    aside = checkpointer.set_aside(damaged) if is_primary else None
    say(f'moved the damaged checkpoint of step {damaged} to {aside}')
  multihost_utils.sync_global_devices('damaged checkpoints set aside')
  return latest, state, extra


def say_mixed_shapes(run: Run, members: int, say: Callable[[str], None]) -> None:
  """Says what the data's several batch shapes cost `members` runs like `run` trained together or
  several steps per dispatch, if anything."""
  notice = mixed_shapes_notice(dict(zip(run.train_iter.batch_shapes, run.train_iter.shape_batches)),
                               run.config.train.steps_per_call, members, run.config.data.max_length)
  if notice:
    say(notice)
