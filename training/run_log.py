"""What a run shows a person and leaves for sweeps to read.

WORKDIR/metrics.jsonl   one JSON object per record: {"step": N, "<metric>": value, ...},
                        in step order: a resumed run first drops the records after
                        its checkpoint's step, which it is about to write again.
WORKDIR/events.out.*    the same scalars for TensorBoard (tensorboardX, no TensorFlow);
                        a resumed run purges the steps after its checkpoint there too.
WORKDIR/status.json     {"state", "step", "message", "updated"}, replaced atomically.

Plus a tqdm progress bar for terminals and the divergence check that stops a run.
"""

import datetime
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np
from tensorboardX import SummaryWriter
import tqdm

STATES = ('running', 'finished', 'failed', 'diverged')


def _to_python(value: Any) -> int | float | bool:
  # Device and numpy scalars are not JSON serialisable; .item() keeps ints ints.
  return np.asarray(value).item()


def _truncate_after(path: str, step: int) -> None:
  """Rewrites metrics.jsonl with only its whole records up to `step`, atomically."""
  if not os.path.exists(path):
    return
  kept = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:  # the last line of a killed write
        continue
      if record['step'] <= step:
        kept.append(line if line.endswith('\n') else line + '\n')
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    f.writelines(kept)
  os.replace(path + '.tmp', path)


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
    if is_primary:
      os.makedirs(workdir, exist_ok=True)
      path = os.path.join(workdir, 'metrics.jsonl')
      _truncate_after(path, start_step)
      self._jsonl = open(path, 'a', encoding='utf-8')
      # TensorBoard hides this file's and earlier files' events from purge_step on.
      self._tensorboard = SummaryWriter(logdir=workdir, purge_step=start_step + 1)

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
    self._jsonl.write(json.dumps({'step': int(step), **values}) + '\n')
    self._jsonl.flush()
    for name, value in values.items():
      self._tensorboard.add_scalar(name, value, global_step=int(step))
    self._tensorboard.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
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
  os.makedirs(workdir, exist_ok=True)
  # The temporary file sits beside the target because os.replace is atomic only
  # within one filesystem.
  fd, tmp_path = tempfile.mkstemp(prefix='.status.', suffix='.tmp', dir=workdir)
  try:
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      json.dump(status, f, indent=2)
    os.replace(tmp_path, os.path.join(workdir, 'status.json'))
  except BaseException:
    os.unlink(tmp_path)
    raise


class ProgressBar:
  """A tqdm bar over optimizer steps with loss, learning rate and tokens/s.

  tqdm supplies the rate and ETA. The bar stays silent under CI (env var CI
  set) and when its stream is not a terminal, so logs and captured output
  are not filled with carriage returns.
  """

  def __init__(self, total_steps: int, initial_step: int = 0, *, file: TextIO | None = None):
    """Starts the bar.

    Args:
      total_steps: Steps of the whole run.
      initial_step: Step resumed from, so the ETA counts only what remains.
      file: Stream drawn on; stderr by default.
    """
    file = sys.stderr if file is None else file
    quiet = bool(os.environ.get('CI')) or not file.isatty()
    self._bar = tqdm.tqdm(
        total=total_steps, initial=initial_step, file=file, disable=quiet,
        unit='step', dynamic_ncols=True)

  def update(self, step: int, **postfix: Any) -> None:
    """Moves the bar to `step` and shows `postfix`, e.g. loss=, lr=, tok_s=.

    Args:
      step: Current optimizer step (absolute, not an increment).
      **postfix: Scalars shown after the bar; tqdm shortens them (3 significant
        digits where that is shorter).
    """
    # Postfix first: update() redraws, at most every 0.1 s.
    self._bar.set_postfix(
        {name: _to_python(value) for name, value in postfix.items()}, refresh=False)
    self._bar.update(step - self._bar.n)

  def close(self) -> None:
    self._bar.close()


class DivergenceError(RuntimeError):
  """Loss or gradient norm became NaN or infinite."""

  def __init__(self, step: int, loss: float, grad_norm: float):
    self.step, self.loss, self.grad_norm = step, loss, grad_norm
    super().__init__(
        f'Training diverged at step {step}: loss={loss}, grad_norm={grad_norm}'
        ' (must be finite). Lower the learning rate, lengthen the warmup or set'
        ' config.optim.clip_norm.')


def check_finite(step: int, loss: Any, grad_norm: Any) -> None:
  """Raises `DivergenceError` if `loss` or `grad_norm` is NaN or infinite.

  Converting device scalars blocks until the step is computed, so call it on
  the steps whose metrics are fetched anyway.

  Args:
    step: Optimizer step the values belong to.
    loss: Training loss, any scalar.
    grad_norm: Global gradient norm, any scalar.
  """
  loss, grad_norm = float(loss), float(grad_norm)
  if not (math.isfinite(loss) and math.isfinite(grad_norm)):
    raise DivergenceError(int(step), loss, grad_norm)
