"""The training loop's periodic actions: each owns its cadence and its state (clu's periodic actions).

trainer.py's loop dispatches a step, advances `Progress` and hands the step to them:
  MetricsReport  every train.log_every steps: the metrics record, the console, divergence
  Validation     every train.eval_every steps: validation loss and greedy BLEU
  Checkpointing  every train.checkpoint_every steps, and on a stop signal
  EpochClock     each epoch's wall time
  Profiling      once, train.profile_steps steps traced with jax.profiler
  (time_budget.BudgetKeeper: a budgeted run's plans and its early end)
`Clock` keeps the seconds that are not training (compiling, validating, saving) out of tokens/s
and out of a budget's step timing; `MetricsWindow` holds the step metrics summed on device.
"""

import dataclasses
import math
import threading
import time

from absl import logging
import jax

from evaluation.validation import Evaluator
from training import run_log, train_state
from training.checkpointing import Checkpointer


@dataclasses.dataclass
class Progress:
  """Where the loop is; the loop advances it, a budget's plan moves `total_steps`."""
  step: int
  total_steps: int  # the run's last step: num_steps / num_epochs, or fewer under a time budget
  epoch: int = 0
  steps_this_run: int = 0  # steps of this invocation

  @property
  def at_end(self) -> bool:
    return self.step == self.total_steps


class Clock:
  """This invocation's clocks: the run's wall time, the metrics window's, and the paused seconds."""

  def __init__(self, run_start: float, earlier_seconds: float = 0.0):
    """Args: run_start: perf_counter at the invocation's start; earlier_seconds: wall time of the
    run's earlier invocations, up to their last checkpoint."""
    self._run_start, self._earlier_seconds = run_start, earlier_seconds
    self.window_start = time.perf_counter()
    self.paused = 0.0  # seconds of this invocation spent compiling, validating and saving

  def invocation_seconds(self) -> float:
    return time.perf_counter() - self._run_start

  def run_seconds(self) -> float:
    """Wall time of the run so far: earlier invocations up to their last checkpoint, and this one."""
    return self._earlier_seconds + time.perf_counter() - self._run_start

  def pause(self, seconds: float) -> None:
    """Leaves `seconds` of this invocation out of training time."""
    self.paused += seconds
    self.window_start += seconds

  def window_seconds(self, until: float | None = None) -> float:
    return (time.perf_counter() if until is None else until) - self.window_start

  def new_window(self, seconds_so_far: float = 0.0) -> None:
    """Starts a metrics window that already holds `seconds_so_far` of training (a restored one)."""
    self.window_start = time.perf_counter() - seconds_so_far


class Eta:
  """The seconds a run has left: its remaining steps at this invocation's training pace (pauses
  left out), plus the validations and checkpoints still due, the final ones included, at the
  latest measured cost of each (counted from the first one measured)."""

  def __init__(self, clock: Clock, *, eval_every: int, checkpoint_every: int):
    self._clock, self._eval_every, self._checkpoint_every = clock, eval_every, checkpoint_every
    self._start, self._paused_at_start = time.perf_counter(), clock.paused
    self.validation_seconds = self.save_seconds = 0.0

  def seconds_left(self, progress: Progress) -> float | None:
    """None before this invocation's first step. Called as a step is reported, before that step's
    own validation and checkpoint, which it counts."""
    if not progress.steps_this_run:
      return None
    training = time.perf_counter() - self._start - (self._clock.paused - self._paused_at_start)
    steps_left = progress.total_steps - progress.step
    return (training / progress.steps_this_run * steps_left
            + _due_from(progress.step, progress.total_steps, self._eval_every)
            * self.validation_seconds
            + _due_from(progress.step, progress.total_steps, self._checkpoint_every)
            * self.save_seconds)


def _due_from(step: int, last_step: int, every: int) -> int:
  """How many of steps step..last_step a cadence of `every` acts at, the last step always."""
  if last_step < step:
    return 0
  return last_step // every - (step - 1) // every + (last_step % every != 0)


class MetricsWindow:
  """The metric sums of the steps since the last record, on device (train_state.accumulate_metrics)."""

  def __init__(self, new_window, saved_sums: dict | None = None, *, replicated=None):
    self._new_window = new_window
    if saved_sums is None:
      self.sums = new_window()
    else:
      self.sums = jax.jit(lambda: train_state.metrics_window_from_json(saved_sums),
                          out_shardings=replicated)()

  def settle(self) -> dict:
    """Waits for the queued steps; returns their sums on the host, or stops a run gone non-finite.

    Called only where the host needs the device anyway: to log, evaluate, save or stop.
    """
    host = jax.device_get(self.sums)
    if host['nonfinite_step']:
      raise run_log.DivergenceError(int(host['nonfinite_step']),
                                    f'loss={host["nonfinite_loss"]}, grad_norm='
                                    f'{host["nonfinite_grad_norm"]} (must be finite)')
    return host

  def reset(self) -> None:
    self.sums = self._new_window()


class MetricsReport:
  """Every `log_every` steps (and the last): one metrics record, the console, the divergence watch."""

  def __init__(self, *, log_every: int, writer: run_log.MetricsWriter, console, loss_watch,
               window: MetricsWindow, clock: Clock, compile_seconds: dict, schedule, eta: Eta,
               status):
    """`status(step)` writes status.json's step (process 0; a no-op elsewhere)."""
    self.every, self._writer, self._console = log_every, writer, console
    self._loss_watch, self._window, self._clock = loss_watch, window, clock
    self._compile_seconds, self._schedule, self._eta = compile_seconds, schedule, eta
    self._status = status

  def __call__(self, progress: Progress) -> None:
    step = progress.step
    if step % self.every and not progress.at_end:
      if self._console:
        self._console.step(step)
      return
    sums = self._window.settle()
    elapsed = self._clock.window_seconds()
    record = {
        'epoch': progress.epoch,
        'train_loss': float(sums['train_loss'] / sums['steps']),
        'train_nll': float(sums['train_nll'] / sums['steps']),
        'grad_norm': float(sums['grad_norm']),
        'learning_rate': self._schedule.learning_rate(step),
        'tokens_per_sec': float(sums['target_tokens']) / elapsed,
        'compiled_shapes': len(self._compile_seconds),
        'compile_seconds': float(sum(self._compile_seconds.values())),
    }
    self._writer.write(step, record)
    self._loss_watch.check(step, record['train_loss'])
    self._status(step)
    if self._console:
      self._console.update(step, self._eta.seconds_left(progress), epoch=progress.epoch,
                           loss=record['train_loss'], lr=record['learning_rate'],
                           tok_s=record['tokens_per_sec'])
    self._window.reset()
    self._clock.new_window()


@dataclasses.dataclass(frozen=True)
class ValidationResult:
  metrics: dict
  seconds: float  # the validation's wall time, less its compiling
  compile_seconds: float  # what it compiled, which later validations reuse


class Validation:
  """Every `eval_every` steps (and the last): loss and greedy BLEU on the validation split."""

  def __init__(self, *, every: int, evaluator: Evaluator, writer: run_log.MetricsWriter, say,
               earlier_records: list[dict]):
    self.every, self._evaluator, self._writer, self._say = every, evaluator, writer, say
    earlier = [record for record in earlier_records if 'eval_loss' in record]
    self._best = {'eval_loss': min((record['eval_loss'] for record in earlier), default=math.inf),
                  'bleu': max((record['bleu'] for record in earlier), default=-math.inf)}

  def due(self, progress: Progress, also_at: int | None = None) -> bool:
    return progress.step % self.every == 0 or progress.at_end or progress.step == also_at

  def __call__(self, progress: Progress, state: train_state.TrainState,
               window: MetricsWindow) -> ValidationResult:
    window.settle()
    start = time.perf_counter()
    with CompileClock() as compiling:
      metrics = self._evaluator(train_state.model_variables(state.params, state.batch_stats), state)
    # A later validation reuses what this one compiled: a time budget charges it without that.
    seconds = time.perf_counter() - start - compiling.seconds
    self._writer.write(progress.step, metrics)
    logging.info('step %d: %s', progress.step, metrics)
    self._best['eval_loss'] = min(self._best['eval_loss'], metrics['eval_loss'])
    self._best['bleu'] = max(self._best['bleu'], metrics['bleu'])
    self._say(f'step {progress.step}: validation loss {metrics["eval_loss"]:.3f} (best '
              f'{self._best["eval_loss"]:.3f}), greedy BLEU {metrics["bleu"]:.2f} (best '
              f'{self._best["bleu"]:.2f})')
    return ValidationResult(metrics, seconds, compiling.seconds)


# The version of the resume data a checkpoint holds beside the state, and what each one added:
#   1  data_iterator, epoch
#   2  metrics_window: the steps trained since the last record, so the next record covers them
#   3  run_seconds (the run's wall time so far, which a time budget counts) and resume_format
RESUME_FORMAT = 3


def upgrade_resume_data(extra: dict) -> dict:
  """A checkpoint's resume data of any format, in the current one.

  A format-1 checkpoint resumes with an empty metrics window (its next record covers only the steps
  after the resume); format 1 or 2 with no wall time counted before it.

  Raises:
    ValueError: the checkpoint was written by a newer format than this code reads.
  """
  found = extra.get('resume_format',
                    3 if 'run_seconds' in extra else 2 if 'metrics_window' in extra else 1)
  if found > RESUME_FORMAT:
    raise ValueError(f'the checkpoint holds resume data of format {found}; this code reads formats '
                     f'up to {RESUME_FORMAT}')
  return {'metrics_window': None, 'run_seconds': 0.0, **extra, 'resume_format': RESUME_FORMAT}


class Checkpointing:
  """Every `every` steps (and the last, and on a stop signal): the state and what resuming needs.

  A checkpoint holds, besides the state, the data iterator's position, the epoch, the metric sums
  of the steps not yet recorded and their training seconds (so the next record after a resume
  covers the same steps as an uninterrupted run's), and the run's wall time so far.
  """

  def __init__(self, *, every: int, save_on_stop_after: int, checkpointer: Checkpointer,
               train_iter, clock: Clock, last_saved: int):
    self.every, self._save_on_stop_after = every, save_on_stop_after
    self._checkpointer, self._train_iter, self._clock = checkpointer, train_iter, clock
    self.last_saved = last_saved

  def due(self, progress: Progress, also_at: int | None = None) -> bool:
    return progress.step % self.every == 0 or progress.at_end or progress.step == also_at

  def save(self, progress: Progress, state: train_state.TrainState, sums: dict,
           window_seconds: float, metrics: dict | None = None, force: bool = False) -> float:
    """Saves at `progress.step` with the window's host `sums`; returns the seconds the loop waited."""
    start = time.perf_counter()
    extra = {'data_iterator': self._train_iter.get_state(), 'epoch': progress.epoch,
             'metrics_window': {'sums': train_state.metrics_window_to_json(sums),
                                'seconds': window_seconds},
             'run_seconds': self._clock.run_seconds(), 'resume_format': RESUME_FORMAT}
    self._checkpointer.save(progress.step, state, extra, metrics=metrics, force=force)
    self.last_saved = progress.step
    return time.perf_counter() - start

  def save_on_stop(self, progress: Progress, state: train_state.TrainState,
                   window: MetricsWindow) -> bool:
    """Before a stop: saves unless the last checkpoint is fewer than save_on_stop_after steps old."""
    sums = window.settle()
    due = bool(self._save_on_stop_after
               and progress.step - self.last_saved >= self._save_on_stop_after)
    if due:
      self.save(progress, state, sums, self._clock.window_seconds(), force=True)
    self._checkpointer.wait_until_finished()
    return due


class EpochClock:
  """Each epoch's wall time, data, steps, validation, checkpoints and compiling included, for the
  epochs this invocation trains whole (`epoch_finished`, `epoch_seconds` records)."""

  def __init__(self, writer: run_log.MetricsWriter, steps_per_epoch: int):
    self._writer, self._steps_per_epoch = writer, steps_per_epoch
    self._start: float | None = None  # None: this invocation began inside the epoch

  def before_steps(self, progress: Progress, batch_epochs: list[int]) -> None:
    """Called with the epoch of each batch about to be trained (one call's group), in order."""
    for offset, batch_epoch in enumerate(batch_epochs):
      step = progress.step + offset
      if batch_epoch != progress.epoch or progress.steps_this_run + offset == 0:
        self._finish(step, progress.epoch)
        self._start = time.perf_counter() if step % self._steps_per_epoch == 0 else None
      progress.epoch = batch_epoch

  def finish(self, progress: Progress) -> None:
    """Records the epoch just finished, if this invocation saw all of it."""
    self._finish(progress.step, progress.epoch)

  def _finish(self, step: int, epoch: int) -> None:
    if self._start is not None:
      seconds = time.perf_counter() - self._start
      self._writer.write(step, {'epoch_finished': epoch, 'epoch_seconds': seconds})
      logging.info('epoch %d finished at step %d in %.1f s', epoch, step, seconds)


class Profiling:
  """`steps` training steps traced with jax.profiler into `folder`, once, from this invocation's
  first metrics record on: the first step's compiling stays out of the trace.

  The trace starts after the pause at its first step's predecessor (record, validation,
  checkpoint) and stops before the pause at its last step, each time with the device idle (the
  queued steps finished): it holds those steps and the host's work between them, nothing else.
  Writing it out is left out of training time. The loop ends a group of steps where the trace
  starts or stops. Python's own calls are not traced: tracing them would slow the host loop whose
  share of the time the trace is there to show.
  """

  def __init__(self, *, steps: int, log_every: int, start_step: int, folder: str, clock: Clock,
               say):
    self.start_at = (start_step // log_every + 1) * log_every if steps else None
    self.stop_at = self.start_at + steps if steps else None
    self._folder, self._clock, self._say = folder, clock, say
    self._tracing = self._traced = False

  def next_at(self, step: int) -> int | None:
    """The first step after `step` at which the trace starts or stops, if any."""
    return next((at for at in (self.start_at, self.stop_at) if at is not None and at > step), None)

  def before_steps(self, step: int, state) -> None:
    """Before the loop takes the batches that follow `step`."""
    if step == self.start_at:
      jax.block_until_ready(state)
      options = jax.profiler.ProfileOptions()
      options.python_tracer_level = 0
      jax.profiler.start_trace(self._folder, create_perfetto_trace=True, profiler_options=options)
      self._tracing = self._traced = True

  def after_steps(self, progress: Progress, state) -> None:
    """After the steps up to `progress.step` are dispatched, before the pause there; a run that
    ends first ends the trace at its last step."""
    if self._tracing and (progress.step == self.stop_at or progress.at_end):
      jax.block_until_ready(state)
      self.close(progress.step)

  def close(self, step: int) -> None:
    """Stops a trace still running (at `step`: its last step, or where the loop left), or says
    that none was taken."""
    if self.start_at is not None and not self._traced:
      self._say(f'no profile: training stopped at step {step}, and the trace '
                f'(train.profile_steps) was to hold steps {self.start_at + 1}-{self.stop_at}')
      self._traced = True  # said once
    if not self._tracing:
      return
    writing_start = time.perf_counter()
    jax.profiler.stop_trace()
    self._tracing = False
    self._clock.pause(time.perf_counter() - writing_start)
    self._say(f'profile of steps {self.start_at + 1}-{step} written to {self._folder} '
              f'(python -m scripts.profile_summary {self._folder})')


class CompileClock:
  """Context manager: `seconds` is the compile time, in this thread, of the `with` block.

  A first validation compiles its decoder as it runs: most of it on an accelerator, about half on
  a 2-core CPU. A time budget that charged every later validation the first one's compilation would
  plan far too few steps where validations are frequent, so `Validation` leaves it out.

  The clock listens to jax.monitoring's compile events (`/jax/core/compile/...`), each a span of
  wall time, and counts their union in its own thread: spans that nest (a jitted function traced
  inside another's trace) count once, another thread's compilation (a checkpoint's background
  save) not at all.
  """

  _PREFIX = '/jax/core/compile/'

  def __init__(self):
    self._spans: list[tuple[float, float]] = []
    self._thread = threading.get_ident()

  def _listen(self, event: str, start: float, end: float, **fields) -> None:
    del fields  # function names and the like
    if event.startswith(self._PREFIX) and threading.get_ident() == self._thread:
      self._spans.append((start, end))

  def __enter__(self) -> 'CompileClock':
    self._thread = threading.get_ident()
    jax.monitoring.register_event_time_span_listener(self._listen)
    return self

  def __exit__(self, *exc_info) -> None:
    jax.monitoring.unregister_event_time_span_listener(self._listen)

  @property
  def seconds(self) -> float:
    """The union of the compile spans seen so far, in seconds."""
    total, covered_to = 0.0, float('-inf')
    for start, end in sorted(self._spans):
      if end > covered_to:
        total += end - max(start, covered_to)
        covered_to = end
    return total
