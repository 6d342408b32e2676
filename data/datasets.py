"""Dataset names, splits, and the prepared TFDS data behind them.

Prepared data lives under `<cache_dir>/tfds/<source fingerprint>` (cache_dir from
config.data, by default ~/.cache/seq2seq_lab): the first use reads and checks the
raw files and writes ArrayRecord files, later uses only read them. The fingerprint
(`source_fingerprint`) covers every raw file's name and bytes, so other or edited raw
files are prepared afresh instead of meeting stale data, while the same files copied,
re-extracted or touched (new modification times) keep their prepared data and let a run
resume; the tokenizer and token-id caches carry it too.
"""

import contextlib
import fcntl
import functools
import hashlib
import io
import json
import os
from pathlib import Path
from typing import NamedTuple, Sequence

from absl import logging
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from data import builder
from data import iwslt14
from data import multi30k
from data import sources

# config.data.dataset -> builder class.
BUILDERS = {'multi30k': multi30k.Multi30k, 'iwslt14': iwslt14.Iwslt14}
DEFAULT_CACHE_DIR = '~/.cache/seq2seq_lab'


class SplitText(NamedTuple):
  """A split's text in source order (list index = example index)."""
  source: list[str]
  reference: list[str]
  # The target side's tokenized form, for "tokenized BLEU".
  reference_tokenized: list[str]


def cache_dir(data_config) -> Path:
  """Root of prepared datasets, tokenizers and token ids."""
  return Path(data_config.cache_dir or DEFAULT_CACHE_DIR).expanduser()


def compilation_cache_dir(data_config) -> Path:
  """Where train.py and eval.py keep compiled programs (JAX's persistent compilation cache):
  $JAX_COMPILATION_CACHE_DIR where it names one, else <cache_dir>/xla."""
  return Path(os.environ.get('JAX_COMPILATION_CACHE_DIR') or cache_dir(data_config) / 'xla')


def source_fingerprint(data_config) -> str:
  """12 hex digits identifying the raw files prepared data is made from.

  A hash of the dataset, builder config and builder version and, for every file under the
  source folder, its relative name and the sha256 of its bytes (a download, which has no folder
  before it runs, is 'download'). Content, not modification times: a data folder copied to
  another machine or restored from an archive is the same data. A process reads each file once
  per (size, modification time) it sees (~0.01 s for Multi30k's 2.8 MB; about a second per GB).

  Raises:
    sources.MissingSourceError: config.data.source_dir names a folder that does not exist.
  """
  cls = builder_class(data_config.dataset)
  folder = sources.resolve_source_dir(data_config.source_dir, data_config.dataset)
  files = 'download'
  if folder is not None:
    files = sorted((str(path.relative_to(folder)), _file_digest(str(path), path.stat().st_size,
                                                                 path.stat().st_mtime_ns))
                   for path in folder.rglob('*') if path.is_file())
  key = [data_config.dataset, data_config.dataset_config, str(cls.VERSION), files]
  return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]


@functools.cache
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
  """sha256 of a file's bytes. Size and mtime only key the cache: a rewritten file is read again."""
  del size, mtime_ns
  with open(path, 'rb') as file:
    return hashlib.file_digest(file, 'sha256').hexdigest()


def builder_class(dataset: str) -> type[builder.ParallelTextBuilder]:
  if dataset not in BUILDERS:
    raise ValueError(f'Unknown dataset {dataset!r}; valid: {", ".join(BUILDERS)}')
  return BUILDERS[dataset]


def check_dataset_config(data_config) -> None:
  """Raises a ValueError naming the valid builder configs unless data.dataset_config is one."""
  configs = [config.name for config in builder_class(data_config.dataset).BUILDER_CONFIGS]
  if data_config.dataset_config not in configs:
    raise ValueError(f'Unknown {data_config.dataset} dataset_config '
                     f'{data_config.dataset_config!r}; valid: {", ".join(configs)}')


def check_split(dataset: str, split: str) -> None:
  """Raises a ValueError naming the valid splits unless `split` is one."""
  splits = builder_class(dataset).SPLITS
  if split not in splits:
    raise ValueError(
        f'Unknown {dataset} split {split!r}; valid: {", ".join(splits)}')


def language_pair(data_config) -> tuple[str, str]:
  """Returns (source_lang, target_lang), checked against the data."""
  pair = (data_config.source_lang, data_config.target_lang)
  if set(pair) != set(builder.LANGUAGES):
    raise ValueError(f'source_lang/target_lang {pair} must be the two '
                     f'languages {builder.LANGUAGES}, in either order')
  return pair


@contextlib.contextmanager
def _exclusive(lock_path: Path):
  """Holds an advisory flock on `lock_path` (created if absent) for the block."""
  lock_path.parent.mkdir(parents=True, exist_ok=True)
  with open(lock_path, 'a') as lock_file:
    fcntl.flock(lock_file, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock_file, fcntl.LOCK_UN)


def get_builder(data_config, splits: Sequence[str] | None = None):
  """Returns the dataset's TFDS builder, preparing the data on first use.

  Args:
    data_config: `config.data`.
    splits: Prepare only these splits, for a source known to lack the others
      (the offline IWSLT14 copy has no train files); None prepares all.

  Raises:
    ValueError: Unknown dataset, builder config or split.
    sources.SourceError: Raw files missing or unusable (first use only).
  """
  cls = builder_class(data_config.dataset)
  check_dataset_config(data_config)
  root = cache_dir(data_config)
  fingerprint = source_fingerprint(data_config)
  # A partial preparation lives apart so it never stands in for the full data.
  data_dir = root / 'tfds' / fingerprint
  if splits is not None:
    data_dir = root / 'tfds_partial' / fingerprint / '+'.join(sorted(splits))
  # TFDS prints its progress bars and messages to the terminal; they go to the log instead.
  tfds.disable_progress_bar()
  printed = io.StringIO()
  # Processes sharing the cache (sweep hosts, parallel runs) prepare it once: the first holds
  # the lock while preparing, the others then open the prepared data.
  with _exclusive(data_dir.with_name(data_dir.name + '.lock')), contextlib.redirect_stdout(printed):
    dataset_builder = cls(
        config=data_config.dataset_config, data_dir=str(data_dir),
        source_dir=data_config.source_dir, download_dir=str(root / 'downloads'),
        splits=splits, file_format='array_record')
    dataset_builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  if printed.getvalue().strip():
    logging.info('%s', printed.getvalue().strip())
  return dataset_builder


def get_data_sources(data_config, splits: Sequence[str] | None = None) -> dict:
  """Returns split -> random-access TFDS data source (no TensorFlow needed).

  Records are dicts of `de`, `en`, `de_tok`, `en_tok` (bytes) and `index`;
  `load_examples` gives them as str in source order.
  """
  dataset_builder = get_builder(data_config, splits)
  return {split: dataset_builder.as_data_source(split=split)
          for split in splits or dataset_builder.SPLITS}


def load_examples(data_config, split: str) -> dict[str, list[str]]:
  """Returns field -> text of every example of `split`, in source order.

  Memoised per process, as reading a large split takes seconds.
  """
  check_split(data_config.dataset, split)
  return _load_examples(str(cache_dir(data_config)), data_config.dataset,
                        data_config.dataset_config, data_config.source_dir,
                        source_fingerprint(data_config), split)


def load_split_text(data_config, split: str) -> SplitText:
  """Returns the source, reference and tokenized reference text of `split`."""
  source_lang, target_lang = language_pair(data_config)
  examples = load_examples(data_config, split)
  return SplitText(examples[source_lang], examples[target_lang],
                   examples[f'{target_lang}_tok'])


@functools.lru_cache(maxsize=16)
def _load_examples(root: str, dataset: str, dataset_config: str, source_dir: str,
                   fingerprint: str, split: str) -> dict[str, list[str]]:
  del fingerprint  # Part of the memo's key only: edited raw files are read afresh.
  data_config = _DataConfigKey(dataset, dataset_config, source_dir, root)
  # Records are the tf.train.Example protos TFDS stores; parsing them with the
  # proto class TFDS ships is ~5x faster than its generic per-feature decoding
  # (1.4 s instead of 7 s for Multi30k's training split here).
  source = get_builder(data_config).as_data_source(
      split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
  records = source.__getitems__(range(len(source)))
  examples = {field: [''] * len(records) for field in builder.TEXT_FIELDS}
  for record in records:
    features = tf_example_pb2.Example.FromString(record).features.feature
    index = features['index'].int64_list.value[0]
    for field in builder.TEXT_FIELDS:
      examples[field][index] = features[field].bytes_list.value[0].decode()
  return examples


class _DataConfigKey(NamedTuple):
  """The fields of config.data that identify prepared data (hashable)."""
  dataset: str
  dataset_config: str
  source_dir: str
  cache_dir: str
