"""The run directory train.py fills: what is in it, who may write it, and which config it belongs to.

WORKDIR/config.json        the resolved config the run was started with (see `check_resume`)
WORKDIR/source.json        the fingerprint of the raw data files the run trains on
WORKDIR/tokenizer.model    the run's own vocabulary, copied from the data cache on first start
                           (with data.vocabulary='separate': tokenizer.<language>.model, one each)
WORKDIR/metrics.jsonl      metric records (training/run_log.py)
WORKDIR/status.json        running, finished, stopped, failed or diverged (training/run_log.py)
WORKDIR/checkpoints/       orbax checkpoints (training/checkpointing.py)
WORKDIR/damaged_checkpoints/  checkpoints that failed to restore, moved aside by train.py
WORKDIR/train.log          library logging
WORKDIR/eval/              eval.py's hypotheses and scores, <split>.hyp.txt and <split>.json
WORKDIR/profile/           jax.profiler traces of train.profile_steps steps (periodic_actions.Profiling)
WORKDIR/run.lock           who is training the run now (`RunLock`)

A workdir may be a local path or a bucket (`gs://...`, through etils.epath, which orbax uses too):
every read and write of a run folder goes through `path` and the helpers below. Object storage
has no append and no lock: appends rewrite the file, and `RunLock` holds nothing there, so one
writer per run is the launcher's to ensure (scripts/sweep.py's modes give each run one trainer).
"""

import contextlib
import datetime
import fcntl
import json
import os
import socket
from typing import Any

from etils import epath
import jax
import ml_collections
from jax.experimental import multihost_utils

from data import datasets, vocabularies
from training.partitioning import agreed

CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.model'  # a joint vocabulary's; see tokenizer_files
METRICS_FILE = 'metrics.jsonl'
STATUS_FILE = 'status.json'
CHECKPOINT_DIR = 'checkpoints'
DAMAGED_CHECKPOINT_DIR = 'damaged_checkpoints'
LOG_FILE = 'train.log'
EVAL_DIR = 'eval'
PROFILE_DIR = 'profile'
LOCK_FILE = 'run.lock'
SOURCE_FILE = 'source.json'

# Fields a resumed run may change: how long it trains, how often it logs, evaluates and saves, the
# learning-rate schedule, evaluation settings, the slices a step is computed in (the same
# gradient; only the dropout masks are drawn per slice), the steps dispatched at once and the steps
# profiled. Every other field changes the parameters, the optimizer state, the tokenizer, the data
# or the dropout stream, so resuming with another value would fail in orbax or, worse, silently mix
# two experiments.
RESUMABLE_FIELDS = frozenset({
    'train.num_steps', 'train.num_epochs', 'train.time_budget_minutes', 'train.log_every',
    'train.eval_every', 'train.checkpoint_every', 'train.keep_checkpoints', 'train.save_on_stop_after',
    'train.divergence_loss_ceiling', 'train.divergence_growth', 'train.microbatch_tokens',
    'train.steps_per_call', 'train.profile_steps',
    'optim.learning_rate', 'optim.schedule', 'optim.warmup_steps', 'optim.decay_epochs',
    'optim.decay_factor', 'optim.inverse_sqrt_scale',
    'data.cache_dir', 'data.num_workers', 'data.eval_split', 'data.eval_batch_size',
    'data.eval_examples',
    'eval.beam_size', 'eval.length_penalty',
})


class RunFolderError(ValueError):
  """The run directory cannot be used by this invocation; the message is one line."""


def path(workdir: str | os.PathLike, name: str) -> epath.Path:
  """WORKDIR/name, for the names above."""
  return epath.Path(workdir) / name


def tokenizer_files(data: datasets.DataSpec) -> dict[str, str]:
  """Language -> the name of the run folder's copy of its vocabulary (one name twice when joint)."""
  return {lang: TOKENIZER_FILE if model_language is None else f'tokenizer.{model_language}.model'
          for lang, model_language in data.model_languages.items()}


def make_run_folder(workdir: str | os.PathLike) -> None:
  """Creates `workdir` (and its parents) if absent; raises RunFolderError (one line) where it is a
  file, lies under one, or cannot be created, read or written."""
  folder = epath.Path(workdir)
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise RunFolderError(f'{os.fspath(workdir)} is a file or lies under one: a run folder must be '
                         'a folder') from None
  except OSError as error:
    raise RunFolderError(f'cannot create the run folder {os.fspath(workdir)}: '
                         f'{error.strerror or error}') from None
  if is_local(workdir) and not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
    raise RunFolderError(f'{os.fspath(workdir)}: the run folder must be readable and writable '
                         'by this user')


def undo_failed_start(workdir: str | os.PathLike) -> None:
  """Removes what a run's first start wrote when it failed before its first step (config.json,
  source.json, the vocabulary copies, status, metrics and event files, an empty checkpoints
  folder), so that the same command, once the cause is fixed, starts the run afresh instead of
  being refused as a changed run. train.log stays: it holds the failure's traceback."""
  folder = epath.Path(workdir)
  for name in (CONFIG_FILE, SOURCE_FILE, STATUS_FILE, METRICS_FILE):
    (folder / name).unlink(missing_ok=True)
  for written in [*folder.glob('tokenizer*.model'), *folder.glob('events.out.tfevents.*')]:
    written.unlink(missing_ok=True)
  checkpoints = folder / CHECKPOINT_DIR
  if checkpoints.is_dir() and not any(checkpoints.iterdir()):
    checkpoints.rmdir()


def os_error_line(error: OSError) -> str:
  """An OSError as one line naming its file: 'PATH: Permission denied'."""
  where = f'{error.filename}: ' if error.filename else ''
  return f'{where}{error.strerror or error}'


def is_local(folder: str | os.PathLike) -> bool:
  """Whether `folder` is on a local (or mounted) file system rather than object storage."""
  return '://' not in os.fspath(folder)


def check_reachable(folder: str | os.PathLike) -> None:
  """Raises RunFolderError (one line) when `folder` is on object storage this Python cannot reach
  for want of its file-system package (gs:// needs gcsfs without TensorFlow)."""
  if is_local(folder):
    return
  try:
    epath.Path(folder).exists()
  except ImportError as error:
    raise RunFolderError(f'{os.fspath(folder)}: {error} (pip install gcsfs google-cloud-storage; '
                         'see docs/scaling.md)') from None


def replace_text(target: epath.Path, text: str) -> None:
  """Replaces `target` with `text` through a temporary file beside it, so that readers never see
  a half-written file (atomic locally; a copy on object storage, where objects appear whole)."""
  temporary = target.with_name(f'.{target.name}.{os.getpid()}.tmp')
  temporary.write_text(text, encoding='utf-8')
  temporary.replace(target)


def append_text(target: epath.Path, text: str) -> None:
  """Appends `text` to `target`; on object storage, which cannot append, rewrites it."""
  if is_local(target):
    with target.open('a', encoding='utf-8') as f:
      f.write(text)
  else:
    target.write_text((target.read_text(encoding='utf-8') if target.exists() else '') + text,
                      encoding='utf-8')


def resolved_config(config: ml_collections.ConfigDict) -> dict:
  """The config as config.json stores it (tuples become lists)."""
  return json.loads(config.to_json_best_effort())


def read_config(workdir: str) -> dict | None:
  """WORKDIR/config.json, or None before the run's first start."""
  try:
    return json.loads(path(workdir, CONFIG_FILE).read_text(encoding='utf-8'))
  except FileNotFoundError:
    return None


def flatten(tree: dict, prefix: str = '') -> dict[str, Any]:
  """{'model': {'norm': 'rms'}} -> {'model.norm': 'rms'}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f'{prefix}{key}.'))
    else:
      flat[f'{prefix}{key}'] = value
  return flat


def config_changes(previous: dict, new: dict) -> dict[str, tuple[Any, Any]]:
  """Field -> (previous value, new value) of every field that differs (absent reads as None)."""
  before, after = flatten(previous), flatten(new)
  return {name: (before.get(name), after.get(name)) for name in sorted(before.keys() | after.keys())
          if before.get(name) != after.get(name)}


def check_resume(workdir: str, config: ml_collections.ConfigDict) -> dict[str, tuple[Any, Any]]:
  """Refuses a config that cannot continue the run in `workdir`; returns the allowed changes.

  Decided from config.json alone, before anything is written or built. Fields absent from
  config.json (added to configs/base.py after the run started) are accepted.

  Raises:
    RunFolderError: naming each field outside RESUMABLE_FIELDS that differs, with both values.
  """
  previous = read_config(workdir)
  if previous is None:
    return {}
  changes = config_changes(previous, resolved_config(config))
  # A field the run's config.json lacks was added to the code since; the run had its default.
  refused = {name: (old, new) for name, (old, new) in changes.items()
             if name not in RESUMABLE_FIELDS and old is not None}
  if refused:
    listed = '; '.join(f'{name}: {old!r} in the run, {new!r} now' for name, (old, new) in refused.items())
    raise RunFolderError(f'{workdir} was started with another config and cannot resume with this one '
                         f'({listed}); use a new --workdir, or the run\'s own values')
  return changes


def _write_json(workdir: str, name: str, data: dict) -> None:
  """Replaces WORKDIR/name with `data` atomically: readers never see a half-written file."""
  replace_text(path(workdir, name), json.dumps(data, indent=2, sort_keys=True))


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Replaces WORKDIR/config.json (after `check_resume` accepted the config)."""
  _write_json(workdir, CONFIG_FILE, resolved_config(config))


# What source.json's fingerprint is of; a record without it is of the first format, a fingerprint
# of names, sizes and modification times, which a copied or re-extracted data folder changes.
SOURCE_FINGERPRINT_COVERS = 'names and contents'


def check_source(workdir: str, fingerprint: str) -> None:
  """Refuses to resume on other raw data files than the run started with (DataSpec.fingerprint).

  The data iterator's saved position indexes the prepared examples, which edited files change.
  A run started before source.json existed is accepted.
  """
  try:
    started = json.loads(path(workdir, SOURCE_FILE).read_text(encoding='utf-8'))
  except FileNotFoundError:
    return
  if started['fingerprint'] == fingerprint:
    return
  if started.get('covers') != SOURCE_FINGERPRINT_COVERS:
    raise RunFolderError(f'{path(workdir, SOURCE_FILE)} holds the older fingerprint of raw file names, '
                         'sizes and modification times, which copying or re-extracting the data changes: '
                         'if the raw files are the ones the run started with, delete that file to resume')
  raise RunFolderError(f'the raw data files of {workdir} changed since the run started (fingerprint '
                       f'{started["fingerprint"]}, now {fingerprint}): the run cannot resume on other '
                       'data; use a new --workdir or restore the files')


def write_source(workdir: str, fingerprint: str) -> None:
  _write_json(workdir, SOURCE_FILE, {'fingerprint': fingerprint, 'covers': SOURCE_FINGERPRINT_COVERS})


class RunLock:
  """An exclusive claim on a run directory, held while one process trains it.

  An advisory `flock` on WORKDIR/run.lock: the kernel drops it when the holder exits, however it
  exits (kill -9 included), so a lock file left by a dead process is stale by construction and
  the next run simply takes it over. The file records the holder (host, pid, start time) for the
  refusal message. flock works across the processes of one host and, on Linux NFS, across hosts.
  Object storage has no such lock: there the claim is not taken (see the module's docstring).
  """

  def __init__(self, workdir: str):
    self._path = os.fspath(path(workdir, LOCK_FILE))
    self._local = is_local(workdir)
    self._file = None

  def acquire(self) -> None:
    """Takes the lock or raises RunFolderError naming its holder."""
    if not self._local:
      return
    # 'a+' neither truncates the holder's record nor fails when the file exists.
    lock_file = open(self._path, 'a+', encoding='utf-8')
    try:
      fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock_file.seek(0)
      holder = lock_file.read().strip() or 'another process'
      lock_file.close()
      raise RunFolderError(f'{os.path.dirname(self._path) or "."} is being trained by {holder} '
                           f'(lock {self._path}); wait for it to end or stop it') from None
    lock_file.seek(0)
    lock_file.truncate()
    started = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    lock_file.write(f'pid {os.getpid()} on {socket.gethostname()} since {started}\n')
    lock_file.flush()
    self._file = lock_file

  def release(self) -> None:
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> 'RunLock':
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def load_run_vocabularies(workdir: str, data: datasets.DataSpec) -> vocabularies.Vocabularies:
  """The run's own vocabularies: WORKDIR/tokenizer.model (or one per language, see
  tokenizer_files), copied there from the cache on first start.

  Keeping a copy in the workdir means resuming and eval.py never depend on a cache that may have
  been cleared or rebuilt. Process 0 prepares data and tokenizers first, so processes sharing a
  cache never race.
  """
  files = tokenizer_files(data)
  # File name -> a language it encodes (a joint vocabulary's one file encodes both).
  missing = {name: lang for lang, name in files.items() if not path(workdir, name).exists()}
  if jax.process_index() == 0 and missing:
    cached = vocabularies.get_vocabularies(data)
    for name, lang in missing.items():
      target = path(workdir, name)
      temporary = target.with_name(target.name + '.tmp')
      cached.by_language[lang].model_path.copy(temporary, overwrite=True)
      temporary.replace(target)
  multihost_utils.sync_global_devices('data and tokenizer prepared')
  return vocabularies.load({lang: path(workdir, name) for lang, name in files.items()}, data)


@contextlib.contextmanager
def claim_run_folder(workdir: str):
  """Holds `workdir`'s RunLock for the block: taken by process 0, honoured by every process."""
  lock = RunLock(workdir)
  refusal = None
  if jax.process_index() == 0:
    try:
      lock.acquire()
    except RunFolderError as error:
      refusal = error
  if not agreed(refusal is None):
    raise refusal or RunFolderError(f'{workdir} is being trained by another run '
                                    '(process 0 could not lock it)')
  try:
    yield
  finally:
    lock.release()
