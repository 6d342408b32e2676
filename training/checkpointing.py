"""Train-state checkpoints in WORKDIR/checkpoints, kept by orbax.

Each step directory holds two items: `state`, the pytree of arrays (params,
optimizer state, step), and `extra`, JSON with whatever is needed to resume
exactly (data-iterator state, epoch, the unrecorded steps' metric sums).

Retention is orbax's `AnyPreservationPolicy(LatestN(keep), BestN(n=1))`: the
`keep` most recent checkpoints plus the one with the lowest validation loss.

A save never damages the previous checkpoint: orbax writes into
`<step>.orbax-checkpoint-tmp*` and renames it to `<step>` only when complete
(on GCS, which has no atomic rename, it writes a commit_success.txt marker
instead). An interrupted save leaves a tmp directory that step listing ignores
and the next manager removes (`cleanup_tmp_directories`).

Multi-host: every process must call `save` and `restore`; orbax elects the
primary process for directory and metadata writes and synchronises the rest.
"""

from collections.abc import Mapping
from typing import Any

import jax

from etils import epath
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from training import run_dir

PyTree = Any


class CheckpointError(ValueError):
  """A checkpoint cannot be used; the message is one line and names it."""


class DamagedCheckpointError(CheckpointError):
  """A checkpoint's files cannot be read back (truncated, missing, corrupted)."""

  def __init__(self, step: int, directory: epath.Path, cause: BaseException):
    self.step = step
    # orbax wraps TensorStore's error (which names the file and what is wrong with it) in one
    # whose message runs to pages of specs: report the first line of the innermost.
    while cause.__cause__ is not None or cause.__context__ is not None:
      cause = cause.__cause__ or cause.__context__
    lines = str(cause).strip().splitlines()
    reason = f'{type(cause).__name__}: {lines[0][:300] if lines else ""}'
    super().__init__(f'checkpoint {directory / str(step)} cannot be restored ({reason})')


def first_mismatch(expected: PyTree, saved: PyTree) -> str | None:
  """The first array absent from one of two pytrees or shaped differently, or None.

  Leaves are matched by their path of names, so a dataclass field and the dict entry orbax saves
  it as are the same array.
  """
  def shapes(tree):
    return {'/'.join(str(getattr(key, 'name', getattr(key, 'key', getattr(key, 'idx', key))))
                     for key in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
  expected, saved = shapes(expected), shapes(saved)
  for name in sorted(expected.keys() | saved.keys()):
    if expected.get(name) != saved.get(name):
      return (f'{name} is {saved.get(name, "absent")} in the checkpoint, '
              f'{expected.get(name, "absent")} in the model')
  return None


class Checkpointer:
  """Saves and restores (state, extra) pairs every `save_every` steps.

  Saves are asynchronous: `save` returns once arrays are copied off the
  device, and the write finishes in a background thread.
  """

  def __init__(
      self,
      workdir: str | epath.PathLike,
      *,
      keep: int,
      save_every: int,
      best_metric: str = 'val_loss',
      read_only: bool = False,
  ):
    """Opens (or creates) WORKDIR/checkpoints.

    Args:
      workdir: Run directory; relative local paths are made absolute, as orbax
        requires.
      keep: Most recent checkpoints kept (`config.train.keep_checkpoints`).
      save_every: Steps between saves (`config.train.checkpoint_every`); `save`
        skips other steps unless forced.
      best_metric: Key of the `metrics` passed to `save` that ranks checkpoints;
        lower is better.
      read_only: For readers such as eval.py: neither create the folder nor
        remove unfinished saves, which may be a live run's save in progress.
        (The removal also runs in a background thread that a reader exiting
        at once races with, failing at interpreter shutdown.)
    """
    if keep < 1 or save_every < 1:
      raise ValueError(f'keep={keep} and save_every={save_every} must be >= 1.')
    directory = epath.Path(workdir) / run_dir.CHECKPOINT_DIR
    if not directory.is_absolute():
      directory = directory.resolve()
    self._best_metric = best_metric
    get_metric = lambda metrics: metrics[best_metric]
    options = ocp.CheckpointManagerOptions(
        # Not orbax's default policy, which also saves the first step it sees.
        save_decision_policy=checkpoint_managers.AnySavePolicy([
            checkpoint_managers.FixedIntervalPolicy(save_every),
            checkpoint_managers.PreemptionCheckpointingPolicy(),
        ]),
        preservation_policy=checkpoint_managers.AnyPreservationPolicy([
            checkpoint_managers.LatestN(n=keep),
            checkpoint_managers.BestN(
                get_metric_fn=get_metric, reverse=True, n=1,
                keep_checkpoints_without_metrics=False),
        ]),
        # Retention comes from preservation_policy; best_fn makes orbax store the
        # metrics with each step and answer best_step().
        best_fn=get_metric,
        best_mode='min',
        create=not read_only,
        cleanup_tmp_directories=not read_only,
    )
    self._manager = ocp.CheckpointManager(directory, options=options)
    # saved_structure's answers: a finished save's files do not change until the step is set
    # aside or saved again, and each reading costs a quarter of a second.
    self._structures = {}

  @property
  def directory(self) -> epath.Path:
    """WORKDIR/checkpoints, absolute."""
    return self._manager.directory

  def save(
      self,
      step: int,
      state: PyTree,
      extra: Mapping[str, Any],
      metrics: Mapping[str, float] | None = None,
      force: bool = False,
  ) -> bool:
    """Saves a checkpoint if `step` is due (a multiple of save_every) or forced.

    Pass `metrics` (with `best_metric`) when the step was just evaluated, so
    the checkpoint competes for best; checkpoints without them are kept only
    while among the latest.

    Args:
      step: Optimizer step the state is at.
      state: Pytree of arrays; jax arrays keep their sharding on restore.
      extra: JSON-serialisable resume data.
      metrics: Evaluation metrics of this state, e.g. {'val_loss': 2.31}.
      force: Save even when the step is not due, e.g. at the end of training.

    Returns:
      Whether a save started. Steps already saved are skipped, so a forced save
      at the end may coincide with a regular one.
    """
    if metrics is not None:
      if self._best_metric not in metrics:
        raise ValueError(
            f'metrics {sorted(metrics)} lack {self._best_metric!r}, which ranks'
            ' checkpoints.')
      # orbax stores metrics as JSON, which device scalars are not.
      metrics = {name: float(value) for name, value in metrics.items()}
    if step in self._manager.all_steps():
      return False
    self._structures.pop(step, None)
    return self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(dict(extra))),
        metrics=metrics,
        force=force,
    )

  def saved_structure(self, step: int) -> PyTree:
    """The state saved at `step` as a pytree of array metadata (`.shape`, `.dtype`), no data read.

    Raises:
      DamagedCheckpointError: the metadata cannot be read.
    """
    if step in self._structures:
      return self._structures[step]
    self._manager.wait_until_finished()
    handler = ocp.StandardCheckpointHandler()
    try:
      self._structures[step] = handler.metadata(self.directory / str(step) / 'state').tree
    except Exception as error:  # orbax and TensorStore raise many kinds
      raise DamagedCheckpointError(step, self.directory, error) from error
    finally:
      handler.close()
    return self._structures[step]

  def restore(self, step: int, target: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """Restores the checkpoint at `step`.

    Args:
      step: A step from `all_steps()`, usually `latest_step()`.
      target: Pytree with the saved structure, of arrays or of
        `jax.ShapeDtypeStruct`s (e.g. from `jax.eval_shape`); restored arrays
        take its shapes, dtypes and shardings.

    Returns:
      `(state, extra)`.

    Raises:
      CheckpointError: the checkpoint holds other arrays than `target`.
      DamagedCheckpointError: its files cannot be read.
    """
    mismatch = first_mismatch(target, self.saved_structure(step))
    if mismatch:
      raise CheckpointError(f'checkpoint {self.directory / str(step)} does not fit the model: '
                            f'{mismatch}')
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()),
      )
    except Exception as error:  # orbax and TensorStore raise many kinds
      raise DamagedCheckpointError(step, self.directory, error) from error
    return restored.state, restored.extra

  def restore_parts(self, step: int, target: dict) -> dict:
    """The top-level entries of the state saved at `step` that `target` names, read alone.

    A reader of the model (eval.py) needs the parameters and batch statistics, not the
    optimizer's moments, which are twice their size and take most of a full restore's time.

    Args:
      step: A saved step.
      target: Some of the saved state's entries, e.g. {'params': ..., 'batch_stats': ...}, as
        for `restore`.

    Raises:
      CheckpointError: the checkpoint lacks an entry of `target` or holds other arrays in it.
      DamagedCheckpointError: its files cannot be read.
    """
    saved = self.saved_structure(step)
    missing = sorted(set(target) - set(saved))
    mismatch = (f'it has no {", ".join(missing)}' if missing else
                first_mismatch(target, {name: saved[name] for name in target}))
    if mismatch:
      raise CheckpointError(f'checkpoint {self.directory / str(step)} does not fit the model: '
                            f'{mismatch}')
    reader = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
    try:
      return reader.restore(self.directory / str(step) / 'state', args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True))
    except Exception as error:  # orbax and TensorStore raise many kinds
      raise DamagedCheckpointError(step, self.directory, error) from error
    finally:
      reader.close()

  def restore_newest_intact(
      self, target: PyTree, steps: list[int] | None = None, *, on_damaged=None
  ) -> tuple[int, PyTree, dict[str, Any]]:
    """Restores the newest of `steps` (default: all saved) that reads back intact.

    Args:
      target: As for `restore`.
      steps: Candidates; newest is tried first.
      on_damaged: Called with each DamagedCheckpointError passed over (to report it).

    Returns:
      `(step, state, extra)`.

    Raises:
      CheckpointError: every candidate is damaged, or one does not fit `target` (a
        different model: falling back to an older checkpoint would not help).
    """
    candidates = sorted(self.all_steps() if steps is None else steps, reverse=True)
    damaged = []
    for step in candidates:
      try:
        state, extra = self.restore(step, target)
      except DamagedCheckpointError as error:
        damaged.append(step)
        if on_damaged is not None:
          on_damaged(error)
        continue
      return step, state, extra
    raise CheckpointError(f'no checkpoint in {self.directory} can be restored (steps '
                          f'{", ".join(map(str, damaged)) or "none"} are damaged)')

  def set_aside(self, step: int) -> epath.Path:
    """Moves a damaged checkpoint to WORKDIR/damaged_checkpoints/STEP (kept for inspection), so
    that the run can save that step again; returns where it went. Call on process 0 only."""
    aside = self.directory.parent / run_dir.DAMAGED_CHECKPOINT_DIR / str(step)
    if aside.exists():
      aside = aside.parent / f'{step}-{len(list(aside.parent.iterdir()))}'
    aside.parent.mkdir(parents=True, exist_ok=True)
    (self.directory / str(step)).rename(aside)
    self._structures.pop(step, None)
    self._manager.reload()
    return aside

  def latest_step(self) -> int | None:
    """The newest saved step, or None when there is none (a fresh run)."""
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The saved step with the lowest `best_metric`, or None if none has metrics."""
    return self._manager.best_step()

  def all_steps(self) -> list[int]:
    """Saved steps, oldest first."""
    return sorted(self._manager.all_steps())

  def wait_until_finished(self) -> None:
    """Blocks until background writes are complete."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Finishes pending writes and releases orbax's threads."""
    self._manager.close()
