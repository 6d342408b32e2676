"""A trained model opened from a run folder: config, vocabularies, model and (averaged) variables.

What eval.py and the scripts that look inside a trained model (attention maps) start from.
"""

import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from configs import base
from data import datasets, vocabularies as vocabularies_lib
from model.transformer import Transformer
from training import config_checks, partitioning, run_dir, train_state
from evaluation import averaging
from training.checkpointing import Checkpointer, DamagedCheckpointError, first_mismatch

_CHECKPOINT_FORMS = "'last', 'best', a saved step such as 3000, or 'avg:N' with N >= 1"


class Restored(NamedTuple):
  """What `restore` rebuilds from a workdir; `steps` are the checkpoints behind `variables`."""
  config: ml_collections.ConfigDict
  data: datasets.DataSpec  # config.data resolved
  vocabularies: vocabularies_lib.Vocabularies
  model: Transformer
  variables: dict
  steps: list[int]


def parse_checkpoint(spec: str) -> tuple[str, int | None]:
  """'last' -> ('last', None), 'best' -> ('best', None), '3000' -> ('step', 3000), 'avg:5' -> ('avg', 5)."""
  if spec in ('last', 'best'):
    return spec, None
  kind, number = ('avg', spec[len('avg:'):]) if spec.startswith('avg:') else ('step', spec)
  # isdigit() also turns away '', '-1' and '1.5'.
  if not number.isdigit() or (kind == 'avg' and int(number) < 1):
    raise ValueError(f'--checkpoint={spec!r} is not {_CHECKPOINT_FORMS}')
  return kind, int(number)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config train.py saved as WORKDIR/config.json, checked."""
  run_dir.check_reachable(workdir)
  path = run_dir.path(workdir, run_dir.CONFIG_FILE)
  try:
    resolved = run_dir.read_config(workdir)
  except ValueError as error:  # json.JSONDecodeError
    raise ValueError(f'{path}: {error}') from None
  if resolved is None:
    raise ValueError(f'no {run_dir.CONFIG_FILE} in {workdir}: not a run directory of train.py')
  # A field added to configs/base.py since the run was saved keeps its default, as on resume;
  # one the code no longer has stays in and check_config names it.
  config = base.get_config()
  try:
    config.update_from_flattened_dict(run_dir.flatten(resolved))
    config_checks.check_config(config)
  except (TypeError, ValueError) as error:
    raise ValueError(f'{path}: {error}') from None
  return config


def checkpoint_steps(checkpointer: Checkpointer, kind: str, number: int | None) -> list[int]:
  """The saved steps that --checkpoint names (several for 'avg:N')."""
  saved = checkpointer.all_steps()
  listing = f'{checkpointer.directory} holds steps {", ".join(map(str, saved))}'
  if kind == 'avg':
    return averaging.latest_steps(checkpointer, number)
  if kind == 'best':
    best = checkpointer.best_step()
    if best is None:
      raise ValueError(f'--checkpoint=best: no checkpoint has a validation loss; {listing}')
    return [best]
  step = checkpointer.latest_step() if kind == 'last' else number
  if step not in saved:
    raise ValueError(f'--checkpoint={step}: no such checkpoint; {listing}')
  return [step]


def restore_target(checkpointer: Checkpointer, step: int, model: Transformer, mesh) -> dict:
  """Abstract arrays of the model's entries of the train state saved at `step` (params and batch
  statistics, not the optimizer's), replicated on `mesh`, from its metadata.

  Read from the checkpoint, the target fits whatever the run saved, and a shape mismatch is found
  before restoring: a restore that fails part-way leaves orbax's pending reads printing pages of
  TensorStore specs.

  Raises:
    DamagedCheckpointError: the checkpoint's metadata cannot be read.
    ValueError: the checkpoint does not fit `model`.
  """
  sharding = partitioning.replicated(mesh)
  saved = checkpointer.saved_structure(step)
  target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                        {'params': saved['params'], 'batch_stats': saved['batch_stats']})
  dummy = jnp.ones((1, 8), jnp.int32)
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), dummy, dummy, train=False))
  mismatch = first_mismatch(expected, train_state.model_variables(target['params'], target['batch_stats']))
  if mismatch:
    raise ValueError(f'checkpoint at {checkpointer.directory / str(step)} does not match the model of '
                     f'{run_dir.path(checkpointer.directory.parent, run_dir.CONFIG_FILE)}: '
                     f'{mismatch}')
  return target


def restore(workdir: str, split: str | None, checkpoint: str, mesh) -> Restored:
  """Rebuilds vocabularies and model from WORKDIR/config.json and restores (or averages) variables.

  Every check of the command line and of the workdir runs before the vocabularies are loaded. With
  --checkpoint=last a checkpoint that cannot be read is reported on stderr in one line and the
  next older one is used; a damaged checkpoint named any other way is refused.

  Raises:
    ValueError: with a one-line message, for any bad input.
  """
  kind, number = parse_checkpoint(checkpoint)
  config = load_config(workdir)
  data = datasets.resolve(config.data)
  if split is not None:
    datasets.check_split(data.dataset, split)
  # Read-only: the run may still be training, and a save of it in progress must stay.
  checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints,
                              save_every=config.train.checkpoint_every, read_only=True)
  try:
    if not checkpointer.all_steps():
      raise ValueError(f'no checkpoint in {checkpointer.directory}: train.py has not saved one yet')
    steps = checkpoint_steps(checkpointer, kind, number)
    tokenizer_paths = {lang: run_dir.path(workdir, name)
                       for lang, name in run_dir.tokenizer_files(data).items()}
    for path in tokenizer_paths.values():
      if not path.exists():
        raise ValueError(f'no {path.name} in {workdir}: not a workdir written by train.py')
    vocabularies = vocabularies_lib.load(tokenizer_paths, data)
    model = Transformer.of(config.model, vocabularies.source.vocab_size,
                           vocabularies.target.vocab_size)
    # With 'last', older checkpoints stand in for a damaged newest one.
    candidates = ([[step] for step in sorted(checkpointer.all_steps(), reverse=True)]
                  if kind == 'last' else [steps])
    for candidate_steps in candidates:
      try:
        # Checkpoints of one run share a structure: the newest one stands for all of them.
        target = restore_target(checkpointer, candidate_steps[-1], model, mesh)
        # The mean of one checkpoint is the checkpoint itself.
        parts = averaging.load_average(checkpointer, candidate_steps, target)
        variables = train_state.model_variables(parts['params'], parts['batch_stats'])
      except DamagedCheckpointError as error:
        if kind != 'last':
          others = [step for step in checkpointer.all_steps() if step != error.step]
          raise ValueError(f'{error}; other saved steps: {", ".join(map(str, others)) or "none"}') from None
        print(f'{error}; trying the next older checkpoint', file=sys.stderr, flush=True)
        continue
      return Restored(config, data, vocabularies, model, variables, candidate_steps)
    raise ValueError(f'no checkpoint in {checkpointer.directory} can be restored')
  finally:
    checkpointer.close()
