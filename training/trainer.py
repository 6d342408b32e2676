"""The training loop: `train_and_evaluate(config, workdir)`, which train.py runs.

Re-running on an existing workdir resumes from its latest intact checkpoint (params, optimizer
state, step and data-iterator position; dropout keys derive from the step). What the workdir
holds is training/run_dir.py's to say.
"""

import functools
import math
import time

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.experimental import multihost_utils

from data import datasets, pipeline
from training import (budget_plan, compile_clock, partitioning, run_dir, run_log, stop_signals,
                      train_state, validation)
from training.console_lines import describe_data, describe_model, describe_plan, describe_validation
from training.checkpointing import Checkpointer
from training.evaluation import Evaluator
from training.optimizer import RunLength, make_optimizer
from training.process_group import agreed, agreed_numbers, claim_run_folder, load_run_vocabularies


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: int | None = None) -> train_state.TrainState:
  """Trains to config.train.num_steps (or num_epochs, or the fewer steps that fit
  train.time_budget_minutes), resuming from `workdir` if it has checkpoints.

  Before anything is written: the config is checked, the run folder locked (one process group
  trains a run at a time) and, on resume, the config compared with the run's config.json.

  Args:
    config: the full experiment config (configs/base.py fields).
    workdir: run directory.
    stop_after_steps: leave after this many steps of this invocation without a final save, as a
      killed run would (tests of exact resumption).

  Returns:
    The final train state.

  Raises:
    ValueError: a bad config field (one line).
    run_dir.RunFolderError: the folder is locked by another run, or holds a run of another config.
    training.checkpointing.CheckpointError: no checkpoint of the run can be restored.
    run_log.DivergenceError: the run diverged (status.json says so).
    stop_signals.RunStopped: SIGTERM or SIGINT stopped the run after saving (status `stopped`).
  """
  validation.check_config(config)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  with claim_run_folder(workdir):
    changes = run_dir.check_resume(workdir, config)
    fingerprint = datasets.source_fingerprint(config.data)
    run_dir.check_source(workdir, fingerprint)
    return _train(config, workdir, changes, fingerprint, stop_after_steps)


def _train(config: ml_collections.ConfigDict, workdir: str, changes: dict, fingerprint: str,
           stop_after_steps: int | None) -> train_state.TrainState:
  """train_and_evaluate's work once the folder is claimed and the config accepted."""
  run_start = time.perf_counter()
  is_primary = jax.process_index() == 0
  console = run_log.Console() if is_primary else None
  say = console.line if console else lambda text: None
  if is_primary:
    for name, (old, new) in changes.items():
      if old is not None:  # not a field added to the code since the run started
        say(f'{name} changed from {old!r} to {new!r} since this run started')
    run_dir.write_config(workdir, config)
    run_dir.write_source(workdir, fingerprint)
    logging.info('config:\n%s', config)

  say('preparing data and vocabularies (minutes on a dataset\'s first use, then cached)')
  vocabularies = load_run_vocabularies(workdir, config.data)
  model = train_state.build_model(config, vocabularies.source.vocab_size,
                                  vocabularies.target.vocab_size)
  mesh = partitioning.make_mesh()
  train_iter = pipeline.make_train_iterator(
      config.data, vocabularies, seed=config.train.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), batch_multiple=jax.local_device_count())
  steps_per_epoch = train_iter.batches_per_epoch
  max_steps = validation.total_steps(config.train, steps_per_epoch)
  total_steps = max_steps  # less when a time budget plans fewer (training/budget_plan.py)
  # The optimizer state's structure does not depend on the run's length (the step's argument, below).
  tx, _ = make_optimizer(config.optim, steps_per_epoch=steps_per_epoch, total_steps=total_steps)
  state = train_state.create_train_state(model, tx, config.train.seed, mesh)
  checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints,
                              save_every=config.train.checkpoint_every)
  latest = None
  saved_window = None  # the metrics window restored with the checkpoint
  earlier_seconds = 0.0  # wall time of the run's earlier invocations, up to their last checkpoint
  if checkpointer.all_steps():
    latest, state, extra = checkpointer.restore_newest_intact(
        state, on_damaged=lambda error: say(f'{error}; trying the next older checkpoint'))
    train_iter.set_state(extra['data_iterator'])
    # Absent from checkpoints written before 2026-11-26: those runs resume with an empty window.
    saved_window = extra.get('metrics_window')
    earlier_seconds = extra.get('run_seconds', 0.0)  # absent before 2026-11-27
    logging.info('resumed from step %d', latest)
    # Newer checkpoints failed to restore: kept aside, so this run can save those steps anew.
    for damaged in [step for step in checkpointer.all_steps() if step > latest]:
      aside = checkpointer.set_aside(damaged) if is_primary else None
      say(f'moved the damaged checkpoint of step {damaged} to {aside}')
    multihost_utils.sync_global_devices('damaged checkpoints set aside')

  replicated = partitioning.replicated(mesh)
  # An argument of the compiled step, not a constant inside it: runs that differ only in seed
  # then share one compiled program (and the persistent compilation cache).
  # Made by a jitted call, so that every process holds its replica (as with the state).
  dropout_key = jax.jit(lambda: jax.random.PRNGKey(config.train.seed + 1), out_shardings=replicated)()

  def set_length(length: RunLength) -> tuple[optax.Schedule, RunLength]:
    """The schedule of a run of `length` (checked; for the records), and `length` as the compiled
    step's argument (float32 scalars), made as dropout_key is and for the same reasons."""
    _, schedule = make_optimizer(config.optim, steps_per_epoch=steps_per_epoch, total_steps=length)
    return schedule, jax.jit(lambda: RunLength(*(jnp.float32(value) for value in length)),
                             out_shardings=replicated)()

  microbatch_tokens = train_state.microbatch_tokens(config)
  step = int(state.step)
  writer = run_log.MetricsWriter(workdir, is_primary=is_primary, start_step=step)
  budget_minutes = config.train.time_budget_minutes
  warmup_steps = config.optim.warmup_steps
  # A budgeted run's plans, the latest one read back on resume (process 0 reads the records; only
  # its clock decides when to stop early).
  plan = budget_plan.BudgetPlan.of(config.train, max_steps)
  if budget_minutes:
    plan.resume(writer.previous_records if is_primary else [])
    plan.agree(agreed_numbers)
  if plan.planned:
    total_steps = min(max_steps, plan.end_step)
  schedule, schedule_length = set_length(plan.length or RunLength.fixed(total_steps))
  # The step whose end fixes a budgeted run's length: the end of warmup, timed from its middle.
  plan_at = (warmup_steps if budget_minutes and not plan.planned and step < warmup_steps < max_steps
             else None)
  if budget_minutes and not plan.planned and step >= warmup_steps and max_steps > warmup_steps:
    say(f'train.time_budget_minutes={budget_minutes}: no length was planned before step {step} '
        f'(the end of warmup, {warmup_steps}), so the run goes on to step {max_steps}')

  def step_and_accumulate(state, window, batch, dropout_key, length):
    # The run's length is an argument, as the seed's key is: a budgeted run's plan, and runs that
    # differ only in length, reuse one compiled step (and the persistent compilation cache).
    tx_of_length, _ = make_optimizer(config.optim, steps_per_epoch=steps_per_epoch, total_steps=length)
    state, metrics = train_state.train_step(state, batch, model=model, tx=tx_of_length,
                                            label_smoothing=config.train.label_smoothing,
                                            dropout_key=dropout_key,
                                            microbatch_tokens=microbatch_tokens)
    # The step number again, as an output of its own that is not donated to the next step: the
    # loop waits on it to stay at most one step ahead of the device.
    return state, train_state.accumulate_metrics(window, metrics, state.step), state.step + 0

  jit_train_step = jax.jit(
      step_and_accumulate,
      in_shardings=(replicated, replicated, partitioning.batch_sharded(mesh), replicated, replicated),
      out_shardings=(replicated, replicated, replicated), donate_argnums=(0, 1))
  # Jitted, so every sum is its own buffer (the step donates them).
  new_window = jax.jit(train_state.empty_metrics_window, out_shardings=replicated)
  evaluator = Evaluator(config, vocabularies, model, mesh,
                        jax.jit(functools.partial(train_state.eval_step, model=model)))

  say(describe_data(config.data, train_iter, vocabularies))
  length = (f'up to {max_steps} steps, as many as fit {budget_minutes} min (planned at step '
            f'{plan_at})' if plan_at else f'{total_steps} steps')
  say(describe_model(model, state.params, length, latest, microbatch_tokens))
  earlier_evals = [record for record in writer.previous_records if 'eval_loss' in record]
  loss_watch = run_log.LossWatch(
      ceiling=config.train.divergence_loss_ceiling, growth=config.train.divergence_growth,
      lowest=min((record['train_loss'] for record in writer.previous_records if 'train_loss' in record),
                 default=math.inf))
  last_saved = latest or 0
  best = {'eval_loss': min((record['eval_loss'] for record in earlier_evals), default=math.inf),
          'bleu': max((record['bleu'] for record in earlier_evals), default=-math.inf)}
  if is_primary:
    run_log.write_status(workdir, 'running', step=step)
    console.start(None if plan_at else total_steps, initial_step=step)
  window = new_window()
  window_start = time.perf_counter()
  if saved_window:
    # The steps after the last record, trained before the checkpoint: the next record covers
    # them as an uninterrupted run's does.
    window = jax.jit(lambda: train_state.metrics_window_from_json(saved_window['sums']),
                     out_shardings=replicated)()
    window_start -= saved_window['seconds']
  epoch = 0
  # Wall-clock start of the epoch being trained; None when this invocation began inside it.
  # Epoch time is everything: data, steps, evaluation, checkpoints, compiling.
  epoch_start: float | None = None
  compile_seconds: dict[tuple, float] = {}  # per padded batch shape [B, T, S], this invocation
  compiled = set()  # the shapes jit_train_step has compiled
  previous_step_done = None  # the step number output of the step dispatched before
  paused = 0.0  # seconds of this invocation spent compiling, validating and saving
  # A budgeted run times its steps from the middle of warmup, or from where this invocation
  # starts if later, and after each plan from the plan.
  if (plan_at and step >= plan_at // 2) or plan.planned:
    plan.start_timing(step, time.perf_counter(), paused)

  def settle() -> dict:
    """Waits for the queued steps; returns their metrics window, or stops a run gone non-finite.

    Called only where the host needs the device anyway: to log, evaluate, save or stop.
    """
    host = jax.device_get(window)
    if host['nonfinite_step']:
      raise run_log.DivergenceError(int(host['nonfinite_step']),
                                    f'loss={host["nonfinite_loss"]}, grad_norm='
                                    f'{host["nonfinite_grad_norm"]} (must be finite)')
    return host

  def record_epoch_time():
    """Writes how long the epoch just finished took, if this invocation saw all of it."""
    if epoch_start is not None:
      seconds = time.perf_counter() - epoch_start
      writer.write(step, {'epoch_finished': epoch, 'epoch_seconds': seconds})
      logging.info('epoch %d finished at step %d in %.1f s', epoch, step, seconds)

  def run_seconds() -> float:
    """Wall time of the run so far: earlier invocations up to their last checkpoint, and this one."""
    return earlier_seconds + time.perf_counter() - run_start

  def save(at_step, sums, window_seconds, metrics=None, force=False):
    """Saves with the steps not yet recorded: their metric sums (settle()'s) and training seconds."""
    extra = {'data_iterator': train_iter.get_state(), 'epoch': epoch,
             'metrics_window': {'sums': train_state.metrics_window_to_json(sums),
                                'seconds': window_seconds},
             'run_seconds': run_seconds()}
    checkpointer.save(at_step, state, extra, metrics=metrics, force=force)

  def make_plan(clock: float, eval_seconds: float, save_seconds: float, elapsed: float,
                extra: dict) -> bool:
    """Plans the run's end at this step (budget_plan.py), from the steps timed up to `clock`, then
    records and says it; returns whether the end moved."""
    before = plan.plan(step, clock=clock, paused=paused, elapsed_seconds=elapsed,
                       eval_seconds=eval_seconds, save_seconds=save_seconds, agree=agreed)
    writer.write(step, {**plan.record(elapsed), **extra})
    line = describe_plan(plan, step, budget_minutes=budget_minutes, elapsed_seconds=elapsed,
                         before=before, eval_compile_seconds=extra.get('eval_compile_seconds', 0.0))
    if line:
      say(line)
    return plan.end_step != before

  def out_of_time() -> bool:
    """Whether a budgeted run ends at this (log) step, behind its plan; if so it says so and records it."""
    elapsed = run_seconds()
    if not agreed(is_primary and plan.must_end(step, elapsed, config.train.log_every)):
      return False
    say(f'time budget {budget_minutes} min: behind the plan, so the run ends at step {step} '
        f'instead of {total_steps}, its learning rate at {float(schedule(step - 1)):.3g}')
    # The plan, cut short: a later invocation of the finished run resumes to this step, no further.
    plan.cut_short(step)
    if is_primary:
      writer.write(step, plan.record(elapsed))
    return True

  # From here on SIGTERM and SIGINT stop the run at the end of a step (before, they end it at once).
  signals = stop_signals.StopSignals(multiprocess=jax.process_count() > 1)
  signals.install()
  try:
    steps_this_run = 0
    while step < total_steps:
      local_batch = next(train_iter)
      batch_epoch = int(local_batch.pop('epoch'))
      if batch_epoch != epoch or steps_this_run == 0:
        record_epoch_time()
        epoch_start = time.perf_counter() if step % steps_per_epoch == 0 else None
      epoch = batch_epoch
      shape = tuple(local_batch['decoder_input_tokens'].shape) + local_batch['encoder_input_tokens'].shape[1:]
      new_shape = shape not in compiled
      if new_shape:
        # The call below compiles before dispatching. Steps already queued would run during the
        # compilation and be counted out of the throughput with it: let them finish first.
        jax.block_until_ready(window)
      dispatch_start = time.perf_counter()
      state, window, step_done = jit_train_step(state, window, partitioning.global_batch(local_batch, mesh),
                                                dropout_key, schedule_length)
      if new_shape:
        seconds = time.perf_counter() - dispatch_start
        compiled.add(shape)
        compile_seconds[shape] = compile_seconds.get(shape, 0.0) + seconds
        logging.info('train step compiled for batch shape %s in %.1f s (%d shapes so far)', shape,
                     seconds, len(compile_seconds))
        window_start += seconds  # compiling is not training throughput
        paused += seconds
      # Wait for the step before this one, while this one runs: no transfer, and the host stays
      # one step ahead, so a stop signal (handled only between Python calls) acts within a step
      # instead of after a whole log window of queued steps.
      if previous_step_done is not None:
        jax.block_until_ready(previous_step_done)
      previous_step_done = step_done
      step += 1
      steps_this_run += 1
      at_end = step == total_steps
      if plan.planned and step % config.train.log_every == 0 and not at_end and out_of_time():
        total_steps, at_end = step, True
      if step % config.train.log_every == 0 or at_end:
        sums = settle()
        elapsed = time.perf_counter() - window_start
        record = {
            'epoch': epoch,
            'train_loss': float(sums['train_loss'] / sums['steps']),
            'train_nll': float(sums['train_nll'] / sums['steps']),
            'grad_norm': float(sums['grad_norm']),
            'learning_rate': float(schedule(step - 1)),
            'tokens_per_sec': float(sums['target_tokens']) / elapsed,
            'compiled_shapes': len(compile_seconds),
            'compile_seconds': float(sum(compile_seconds.values())),
        }
        writer.write(step, record)
        loss_watch.check(step, record['train_loss'])
        if console:
          console.update(step, epoch=epoch, loss=record['train_loss'], lr=record['learning_rate'],
                         tok_s=record['tokens_per_sec'])
        window, window_start = new_window(), time.perf_counter()
      elif console:
        console.step(step)
      if plan.mark is None and plan_at and step == plan_at // 2:
        plan.start_timing(step, time.perf_counter(), paused)
      eval_metrics = None
      pause_start = time.perf_counter()
      # A budgeted run validates and saves at the end of warmup as well, to time both.
      if step % config.train.eval_every == 0 or at_end or step == plan_at:
        settle()
        eval_start = time.perf_counter()
        with compile_clock.CompileClock() as eval_compiling:
          eval_metrics = evaluator(train_state.model_variables(state.params, state.batch_stats), state)
        # A later validation reuses what this one compiled: the plan charges it without that.
        eval_seconds = time.perf_counter() - eval_start - eval_compiling.seconds
        writer.write(step, eval_metrics)
        logging.info('step %d: %s', step, eval_metrics)
        say(describe_validation(step, eval_metrics, best))
      save_due = step % config.train.checkpoint_every == 0 or at_end or step == plan_at
      # A later plan, at a validation: before the checkpoint, so a run resumed from it plans alike.
      replan = (plan.planned and eval_metrics is not None and not at_end
                and plan.timed_steps(step) >= budget_plan.MIN_TIMED_STEPS)
      moved = replan and make_plan(pause_start, eval_seconds, plan.costs.save_seconds,
                                   run_seconds() + save_due * plan.costs.save_seconds, {})
      if save_due:
        sums = settle()
        save_start = time.perf_counter()
        save(step, sums, pause_start - window_start,
             {'val_loss': eval_metrics['eval_loss']} if eval_metrics else None,
             force=at_end or step == plan_at)
        save_seconds = time.perf_counter() - save_start
        last_saved = step
      if step == plan_at:
        moved = make_plan(pause_start, eval_seconds, save_seconds, run_seconds(),
                          {'eval_compile_seconds': eval_compiling.seconds})
      if moved:
        total_steps = plan.end_step
        schedule, schedule_length = set_length(plan.length)
        if console:
          console.set_total(total_steps, step)
      # Evaluation and saving are not training: keep them out of tokens_per_sec.
      window_start += time.perf_counter() - pause_start
      paused += time.perf_counter() - pause_start
      if replan or step == plan_at:
        plan.start_timing(step, time.perf_counter(), paused)
      if stop_after_steps is not None and steps_this_run >= stop_after_steps:
        checkpointer.wait_until_finished()
        return state
      signum = signals.requested(step)
      if signum is not None and not at_end:
        sums = settle()
        due = config.train.save_on_stop_after and step - last_saved >= config.train.save_on_stop_after
        if due:
          save(step, sums, time.perf_counter() - window_start, force=True)
        checkpointer.wait_until_finished()
        raise stop_signals.RunStopped(signum, step, saved=bool(due))
    settle()
    if step % steps_per_epoch == 0:
      record_epoch_time()
  except run_log.DivergenceError as error:
    logging.error('%s', error)
    if is_primary:
      run_log.write_status(workdir, 'diverged', step=error.step, message=str(error))
    raise
  except stop_signals.RunStopped as stopped:
    if is_primary:
      run_log.write_status(workdir, 'stopped', step=stopped.step, message=str(stopped))
    raise
  except BaseException as error:
    if is_primary:
      run_log.write_status(workdir, 'failed', step=step, message=f'{type(error).__name__}: {error}')
    raise
  finally:
    signals.uninstall()
    checkpointer.close()
    writer.close()
    if console:
      console.close()
  if is_primary:
    run_log.write_status(workdir, 'finished', step=step)
    best_step = checkpointer.best_step()
    budget = f' (time budget {budget_minutes} min)' if budget_minutes else ''
    say(f'finished at step {step} in {(time.perf_counter() - run_start) / 60:.1f} min{budget}; run '
        f'folder {workdir}' + (f', best checkpoint step {best_step}' if best_step is not None else ''))
  return state
