"""What a run shows a person and leaves for sweeps to read.

WORKDIR/metrics.jsonl   one JSON object per record: {"step": N, "<metric>": value, ...},
                        in step order: a resumed run first drops the records after
                        its checkpoint's step, which it is about to write again.
WORKDIR/events.out.*    the same scalars for TensorBoard (tensorboardX, no TensorFlow);
                        a resumed run purges the steps after its checkpoint there too.
WORKDIR/status.json     {"state", "step", "message", "updated"}, replaced atomically.

Plus the console (a few lines and a progress bar) and the divergence check that stops a run.
"""

import datetime
import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from absl import logging as absl_logging
from etils import epath
import numpy as np
from tensorboardX import SummaryWriter
import tqdm

from training import run_dir

# 'stopped': ended by SIGTERM or SIGINT after saving; a re-run resumes it.
STATES = ('running', 'finished', 'stopped', 'failed', 'diverged')


def _to_python(value: Any) -> int | float | bool:
  # Device and numpy scalars are not JSON serialisable; .item() keeps ints ints.
  return np.asarray(value).item()


def _truncate_after(path: epath.Path, step: int) -> list[dict]:
  """Rewrites metrics.jsonl with only its whole records up to `step`, atomically; returns them."""
  if not path.exists():
    return []
  kept, records = [], []
  for line in path.read_text(encoding='utf-8').splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:  # the last line of a killed write
      continue
    if record['step'] <= step:
      kept.append(line + '\n')
      records.append(record)
  run_dir.replace_text(path, ''.join(kept))
  return records


class MetricsWriter:
  """Appends metric records to metrics.jsonl and TensorBoard event files.

  On a multi-host run, construct it everywhere with
  `is_primary=jax.process_index() == 0`; the others write nothing.
  """

  def __init__(self, workdir: str, *, is_primary: bool, start_step: int = 0):
    """Opens the records of `workdir` to continue after `start_step`.

    Args:
      workdir: Run directory.
      is_primary: Whether this process writes.
      start_step: Step the run starts from (its restored checkpoint, 0 for a fresh start).
        Records after it come from an attempt that stopped before its next checkpoint; the
        run writes those steps again, so they are dropped, as is a line cut short by a kill.
    """
    self._jsonl = None
    self._tensorboard = None
    # The records kept from earlier invocations of the run.
    self.previous_records: list[dict] = []
    if is_primary:
      epath.Path(workdir).mkdir(parents=True, exist_ok=True)
      self._jsonl = run_dir.path(workdir, run_dir.METRICS_FILE)
      self.previous_records = _truncate_after(self._jsonl, start_step)
      # TensorBoard hides this file's and earlier files' events from purge_step on. The file name
      # holds the second it was opened; the suffix keeps a resume within the same second from
      # overwriting the earlier file, and sorts after it as TensorBoard reads them.
      self._tensorboard = SummaryWriter(logdir=os.fspath(workdir), purge_step=start_step + 1,
                                        filename_suffix=f'.{time.time_ns()}')

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Records scalar `metrics` at `step`, flushed so a crash loses nothing.

    Args:
      step: Optimizer step the metrics describe.
      metrics: Name -> scalar (python, numpy or jax); names may contain '/' to
        group them in TensorBoard, e.g. 'train/loss'.
    """
    if self._jsonl is None:
      return
    values = {name: _to_python(value) for name, value in metrics.items()}
    run_dir.append_text(self._jsonl, json.dumps({'step': int(step), **values}) + '\n')
    for name, value in values.items():
      self._tensorboard.add_scalar(name, value, global_step=int(step))
    self._tensorboard.flush()

  def close(self) -> None:
    if self._tensorboard is not None:
      self._tensorboard.close()


def write_status(workdir: str, state: str, **fields: Any) -> None:
  """Replaces WORKDIR/status.json, so readers never see a half-written file.

  Args:
    workdir: Run directory.
    state: One of `STATES`.
    **fields: JSON-serialisable extras, conventionally `step` and `message`.
  """
  if state not in STATES:
    raise ValueError(f'state={state!r} is not one of: {", ".join(STATES)}.')
  status = {
      'state': state,
      **fields,
      'updated': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
  }
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  run_dir.replace_text(run_dir.path(workdir, run_dir.STATUS_FILE), json.dumps(status, indent=2))


def route_library_logging(log_file: str | None, *, to_terminal: bool) -> None:
  """Sends library records (absl, orbax, jax; INFO and up) to `log_file` (appended, if given)
  and keeps the terminal to warnings and errors, unless `to_terminal` (an explicit --verbosity)."""
  if log_file is not None:
    add_library_log_file(log_file)
  if not to_terminal:
    absl_logging.get_absl_handler().setLevel(logging.WARNING)
    # orbax's reads of a damaged checkpoint (which the caller falls back from) end as asyncio
    # "exception was never retrieved" errors of hundreds of lines: the log file has them.
    absl_logging.get_absl_handler().addFilter(lambda record: record.name != 'asyncio')
    # orbax warns at every save without validation metrics (a stop's save, a checkpoint_every
    # step that is not an eval_every one); such checkpoints are kept while among the latest.
    absl_logging.get_absl_handler().addFilter(
        lambda record: not str(record.msg).startswith('Requested `tracked_metric`'))
  # A checkpoint read that failed (and was fallen back from) leaves orbax coroutines that Python
  # reports at garbage collection with a traceback each: log them instead of printing them.
  sys.unraisablehook = lambda unraisable: logging.info(
      'ignored %s in %r: %s', type(unraisable.exc_value).__name__, unraisable.object,
      unraisable.exc_value)


# Library log records held before each rewrite of a log file on object storage.
_LOG_BUFFER_RECORDS = 200


class _BufferedAppendHandler(logging.Handler):
  """Log records appended to a file on object storage, which has no append: written out every
  _LOG_BUFFER_RECORDS records and at flush and close (each write rewrites the object)."""

  def __init__(self, log_file: epath.Path):
    super().__init__()
    self._log_file = log_file
    self._lines: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    self._lines.append(self.format(record) + '\n')
    if len(self._lines) >= _LOG_BUFFER_RECORDS:
      self.flush()

  def flush(self) -> None:
    if self._lines:
      run_dir.append_text(self._log_file, ''.join(self._lines))
      self._lines = []

  def close(self) -> None:
    self.flush()
    super().close()



def add_library_log_file(log_file: str | os.PathLike) -> logging.Handler:
  """Appends library records to `log_file` from now on; remove the returned handler to stop."""
  if run_dir.is_local(log_file):
    handler = logging.FileHandler(log_file, encoding='utf-8')
  else:
    handler = _BufferedAppendHandler(epath.Path(log_file))
  handler.setFormatter(absl_logging.PythonFormatter())
  logging.getLogger().addHandler(handler)
  return handler


class Console:
  """What a person watching a run sees: a handful of plain lines and a progress bar.

  On a terminal a tqdm bar moves every step, with the latest loss, tokens/s, epoch and ETA (the
  loop's estimate: training pace plus the validations and checkpoints still due). Lines print
  above the bar. Where the stream is not a terminal (nohup, a pipe, CI with the CI variable set)
  there is no bar: each logged record prints as one plain line with its ETA instead. Library logging goes elsewhere
  (train.py: WORKDIR/train.log).
  """

  def __init__(self, *, file: TextIO | None = None):
    """Lines can be printed at once; the bar waits for `start`.

    Args:
      file: Stream drawn on; stderr by default.
    """
    self._file = sys.stderr if file is None else file
    self._interactive = not os.environ.get('CI') and self._file.isatty()
    self._bar = None

  def start(self, total_steps: int | None, initial_step: int = 0) -> None:
    """Starts the bar (and its clock).

    Args:
      total_steps: Steps of the whole run; None while a time budget has not planned them yet
        (no ETA until `set_total`: one counted to the upper bound would be hours off).
      initial_step: Step resumed from, so the ETA counts only what remains.
    """
    self._total = total_steps
    # Without tqdm's own remaining time: the loop's ETA comes in the postfix (`update`).
    self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, file=self._file,
                          disable=not self._interactive, unit='step', dynamic_ncols=True,
                          bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]')

  def set_total(self, total_steps: int) -> None:
    """Changes the run's length (a time budget's plan) once the bar has started."""
    self._total = self._bar.total = total_steps
    self._bar.refresh()

  def line(self, text: str) -> None:
    """Prints `text` on its own line (above the bar on a terminal)."""
    if self._interactive and self._bar is not None:
      self._bar.write(text, file=self._file)
    else:
      print(text, file=self._file, flush=True)

  def step(self, step: int) -> None:
    """Moves the bar to `step` (absolute, not an increment)."""
    self._bar.update(step - self._bar.n)

  def update(self, step: int, eta_seconds: float | None, **postfix: Any) -> None:
    """Shows a logged record's `postfix` (e.g. epoch=, loss=, tok_s=) after the bar at `step`.

    Args:
      step: Current optimizer step.
      eta_seconds: What the run has left (None: unknown, not shown; also while a time budget
        has not planned the run's length).
      **postfix: Scalars shown after the bar; tqdm shortens them (3 significant digits where
        that is shorter); the plain line shows them the same way.
    """
    values = {name: _to_python(value) for name, value in postfix.items()}
    shown = ', '.join(f'{name}={tqdm.tqdm.format_num(value)}' for name, value in values.items())
    eta = (f'ETA {tqdm.tqdm.format_interval(eta_seconds)}'
           if eta_seconds is not None and self._total is not None else None)
    if self._interactive:
      # Postfix first: update() redraws, at most every 0.1 s.
      self._bar.set_postfix_str(', '.join(filter(None, [shown, eta])), refresh=False)
      self.step(step)
      return
    if self._total is None:
      self.line(f'step {step}: {shown}')
      return
    self.line(f'step {step}/{self._total}: {shown}' + (f', {eta}' if eta else ''))

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


class DivergenceError(RuntimeError):
  """The loss or gradient norm became NaN or infinite, or the loss blew up."""

  def __init__(self, step: int, what: str):
    self.step = step
    super().__init__(
        f'Training diverged at step {step}: {what}. Lower the learning rate, lengthen the warmup '
        'or set config.optim.clip_norm.')


class LossWatch:
  """Stops a run whose loss explodes while staying finite (lr 1e4: 7.4 -> 2.7e9 in a few steps).

  Fed the mean training loss of each logged window, it raises DivergenceError when that mean is
  above `ceiling`, or above `growth` times the lowest window mean seen so far. A healthy run's
  window means wander by tens of percent, well under the default growth of 5; a loss 5x its best
  is above the uniform guess's log(vocab) for any run that had learned anything.
  """

  def __init__(self, *, ceiling: float, growth: float, lowest: float = math.inf):
    """Args: ceiling: 0 disables; growth: 0 disables; lowest: from an earlier invocation."""
    self._ceiling, self._growth, self.lowest = ceiling, growth, lowest

  def check(self, step: int, window_loss: float) -> None:
    if self._ceiling and window_loss > self._ceiling:
      raise DivergenceError(step, f'mean training loss {window_loss:.4g} of the last records is '
                            f'above config.train.divergence_loss_ceiling={self._ceiling:g}')
    if self._growth and window_loss > self._growth * self.lowest:
      raise DivergenceError(step, f'mean training loss {window_loss:.4g} of the last records is '
                            f'{window_loss / self.lowest:.3g}x its lowest, {self.lowest:.4g} '
                            f'(config.train.divergence_growth={self._growth:g})')
    self.lowest = min(self.lowest, window_loss)

