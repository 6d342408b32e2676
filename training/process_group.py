"""What process 0 does for every process of a run: lock its folder, prepare its vocabularies, decide.

On one process these are plain calls; across `jax.distributed` processes the others wait for
process 0 and take its answer, so no two processes race on a shared folder or disagree on a plan.
"""

import contextlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from data import vocabularies as vocabularies_lib
from training import run_dir


def load_run_vocabularies(workdir: str, data_config) -> vocabularies_lib.Vocabularies:
  """The run's own vocabularies: WORKDIR/tokenizer.model (or one per language, see
  run_dir.tokenizer_files), copied there from the cache on first start.

  Keeping a copy in the workdir means resuming and eval.py never depend on a cache that may have
  been cleared or rebuilt. Process 0 prepares data and tokenizers first, so processes sharing a
  cache never race.
  """
  files = run_dir.tokenizer_files(data_config)
  # File name -> a language it encodes (a joint vocabulary's one file encodes both).
  missing = {name: lang for lang, name in files.items() if not run_dir.path(workdir, name).exists()}
  if jax.process_index() == 0 and missing:
    cached = vocabularies_lib.get_vocabularies(data_config)
    for name, lang in missing.items():
      target = run_dir.path(workdir, name)
      temporary = target.with_name(target.name + '.tmp')
      cached.by_language[lang].model_path.copy(temporary, overwrite=True)
      temporary.replace(target)
  multihost_utils.sync_global_devices('data and tokenizer prepared')
  return vocabularies_lib.load({lang: run_dir.path(workdir, name) for lang, name in files.items()},
                               data_config)


def agreed(value: int) -> int:
  """Process 0's `value` (an int or bool) on every process: whether it locked the run folder, what it
  read from the records, what it planned from its clock."""
  if jax.process_count() == 1:
    return value
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def agreed_numbers(values: tuple[float, ...]) -> tuple[float, ...]:
  """Process 0's `values` on every process, as float32 (exact for integers below 2**24)."""
  if jax.process_count() == 1:
    return tuple(values)
  return tuple(float(value) for value in
               multihost_utils.broadcast_one_to_all(np.asarray(values, np.float32)))


@contextlib.contextmanager
def claim_run_folder(workdir: str):
  """Holds `workdir`'s RunLock for the block: taken by process 0, honoured by every process."""
  lock = run_dir.RunLock(workdir)
  refusal = None
  if jax.process_index() == 0:
    try:
      lock.acquire()
    except run_dir.RunFolderError as error:
      refusal = error
  if not agreed(refusal is None):
    raise refusal or run_dir.RunFolderError(f'{workdir} is being trained by another run '
                                            '(process 0 could not lock it)')
  try:
    yield
  finally:
    lock.release()
