"""Checkpoint averaging: the parameter-wise mean of the last N checkpoints.

Averaging the last few checkpoints of a run (Vaswani et al. 2017; fairseq's
scripts/average_checkpoints.py) is a standard last step of IWSLT14 and WMT results:
it smooths out the noise of the final updates.
"""

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np

from training.checkpointing import Checkpointer

PyTree = Any


def average(trees: Iterable[PyTree]) -> PyTree:
  """Leaf-wise mean of pytrees of one structure.

  Sums run in float64, so the mean does not depend on the order of the trees, and each
  leaf is cast back to its dtype. `trees` may be a generator: only the running sum and
  the current tree are held, never all of them.

  Args:
    trees: At least one pytree; every one has the structure, shapes and dtypes of the first.

  Returns:
    The mean, a pytree of numpy arrays.
  """
  total, count, dtypes = None, 0, None
  for tree in trees:
    leaves = jax.tree.map(lambda x: np.asarray(x, np.float64), tree)
    if total is None:
      total, dtypes = leaves, jax.tree.map(lambda x: np.asarray(x).dtype, tree)
    else:
      total = jax.tree.map(np.add, total, leaves)
    count += 1
  if total is None:
    raise ValueError('average() needs at least one pytree')
  return jax.tree.map(lambda x, dtype: (x / count).astype(dtype), total, dtypes)


def latest_steps(checkpointer: Checkpointer, count: int) -> list[int]:
  """The `count` most recent saved steps, oldest first.

  Raises:
    ValueError: when fewer than `count` (or count < 1) checkpoints are saved.
  """
  steps = checkpointer.all_steps()
  if count < 1 or count > len(steps):
    raise ValueError(f'cannot average {count} checkpoints: {checkpointer.directory} holds '
                     f'{len(steps)} (steps {", ".join(map(str, steps)) or "none"})')
  return steps[-count:]


def load_average(checkpointer: Checkpointer, steps: Sequence[int], target: dict) -> dict:
  """Mean of the state's entries that `target` names over the checkpoints at `steps`, each read
  alone (`Checkpointer.restore_parts`) and one checkpoint at a time.

  Args:
    checkpointer: Where the checkpoints are.
    steps: Saved steps to average.
    target: The entries to average, e.g. params and batch statistics, not the optimizer state,
      as abstract arrays.

  Returns:
    The averaged entries, numpy arrays.
  """
  return average(checkpointer.restore_parts(step, target) for step in steps)
