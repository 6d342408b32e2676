"""Dataset names, splits, the prepared TFDS data behind them, and `DataSpec`: config.data
resolved once (`resolve`) into what every data function receives.

Prepared data lives under `<cache_dir>/tfds/<source fingerprint>` (cache_dir from
config.data, by default ~/.cache/seq2seq_lab): the first use reads and checks the
raw files and writes ArrayRecord files, later uses only read them. The fingerprint
(`DataSpec.fingerprint`) covers every raw file's name and bytes, so other or edited raw
files are prepared afresh instead of meeting stale data, while the same files copied,
re-extracted or touched (new modification times) keep their prepared data and let a run
resume; the tokenizer and token-id caches carry it too.
"""

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import io
import json
import os
from pathlib import Path
import re
from typing import NamedTuple, Sequence

from absl import logging
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_example_pb2

from data import builder
from data import iwslt14
from data import multi30k
from data import parallel_text
from data import sources

# config.data.dataset -> builder class.
BUILDERS = {'multi30k': multi30k.Multi30k, 'iwslt14': iwslt14.Iwslt14,
            'parallel_text': parallel_text.ParallelText}
DEFAULT_CACHE_DIR = '~/.cache/seq2seq_lab'


class SplitText(NamedTuple):
  """A split's text in source order (list index = example index)."""
  source: list[str]
  reference: list[str]
  # The target side's tokenized form, for "tokenized BLEU".
  reference_tokenized: list[str]


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """`config.data` resolved once, by `resolve`: which data a run reads, how it is cut into batches,
  and where its caches live. The data functions receive this, not the raw config, so the language
  pair is checked and the raw files fingerprinted in one place. Fields as in configs/base.py, plus
  the derived ones below."""
  dataset: str
  dataset_config: str
  source_dir: str
  source_lang: str
  target_lang: str
  vocabulary: str
  vocab_size: int
  vocab_type: str
  subword_samples: int
  subword_alpha: float
  subword_nbest: int
  max_length: int
  train_max_source_words: int
  max_tokens: int
  pack_length: int
  eval_split: str
  eval_batch_size: int
  eval_examples: int
  num_workers: int
  # Derived: the root of prepared datasets, tokenizers and token ids (data.cache_dir expanded, or
  # DEFAULT_CACHE_DIR).
  cache_dir: Path

  @functools.cached_property
  def fingerprint(self) -> str:
    """12 hex digits identifying the raw files (`_source_fingerprint`), read on first use only: a
    translation of --input text needs no data files.

    Raises:
      sources.MissingSourceError: data.source_dir names a folder that does not exist.
    """
    return _source_fingerprint(self)

  @property
  def languages(self) -> tuple[str, str]:
    """(source_lang, target_lang)."""
    return self.source_lang, self.target_lang

  @property
  def corpus_languages(self) -> tuple[str, str]:
    """The two languages in a direction-free order (sorted): the prepared data, a joint
    vocabulary and the token-id caches serve both directions."""
    return tuple(sorted(self.languages))

  @property
  def model_languages(self) -> dict[str, str | None]:
    """Language -> which sentencepiece model encodes it: None for the joint one, else the
    language's own code (data.vocabulary 'separate')."""
    separate = self.vocabulary == 'separate'
    return {lang: lang if separate else None for lang in self.languages}

  def tokenizer_file(self, model_language: str | None = None) -> Path:
    """Where the cached tokenizer of `model_language` (None: the joint one) is, or will be."""
    suffix = f'-{model_language}' if model_language else ''
    return (self.cache_dir / 'tokenizers' / f'{self.dataset}-{self.dataset_config}-'
            f'{self.fingerprint}-{self.vocab_type}-{self.vocab_size}{suffix}.model')

  def token_ids_dir(self, vocabularies_fingerprint: str) -> Path:
    """Where the token ids of this data under the vocabularies of `vocabularies_fingerprint` are."""
    return (self.cache_dir / 'token_ids' /
            f'{self.dataset}-{self.dataset_config}-{self.fingerprint}-{vocabularies_fingerprint}')


def resolve(data_config) -> DataSpec:
  """`config.data` as a DataSpec, its derived values computed here once (the raw files'
  fingerprint on first use).

  Raises:
    ValueError: an unknown dataset, builder config or eval split, or a language pair that is
      not the data's two languages (one line each).
  """
  _check_dataset_config(data_config)
  pair = (data_config.source_lang, data_config.target_lang)
  languages = builder_class(data_config.dataset).LANGUAGES
  if languages is None and not data_config.source_dir:
    raise ValueError(f'config.data.dataset={data_config.dataset!r} reads your own files: set '
                     'config.data.source_dir to their folder')
  if languages is not None and set(pair) != set(languages):
    raise ValueError(f'config.data.source_lang/target_lang {pair} must be the two languages '
                     f'{languages}, in either order')
  for lang in pair:
    if not re.fullmatch(r'[A-Za-z][\w-]*', lang):
      raise ValueError(f'config.data.source_lang/target_lang {pair}: {lang!r} is not a language '
                       "code such as 'en' or 'pt_br' (letters, digits, '_' and '-')")
  if pair[0] == pair[1]:
    raise ValueError(f'config.data.source_lang and target_lang are both {pair[0]!r}')
  check_split(data_config.dataset, data_config.eval_split)
  fields = {field.name: data_config[field.name] for field in dataclasses.fields(DataSpec)
            if field.name != 'cache_dir'}
  return DataSpec(**fields, cache_dir=_cache_root(data_config.cache_dir))


def _cache_root(cache_dir: str) -> Path:
  return Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()


def compilation_cache_dir(data_config) -> Path:
  """Where train.py and eval.py keep compiled programs (JAX's persistent compilation cache):
  $JAX_COMPILATION_CACHE_DIR where it names one, else <data.cache_dir>/xla."""
  return Path(os.environ.get('JAX_COMPILATION_CACHE_DIR') or
              _cache_root(data_config.cache_dir) / 'xla')


def _source_fingerprint(data: DataSpec) -> str:
  """12 hex digits identifying the raw files prepared data is made from.

  A hash of the dataset, builder config and builder version and, for every file under the
  source folder, its relative name and the sha256 of its bytes (a download, which has no folder
  before it runs, is 'download'). Content, not modification times: a data folder copied to
  another machine or restored from an archive is the same data. A process reads each file once
  per (size, modification time) it sees (~0.01 s for Multi30k's 2.8 MB; about a second per GB).

  Raises:
    sources.MissingSourceError: data.source_dir names a folder that does not exist.
  """
  cls = builder_class(data.dataset)
  folder = sources.resolve_source_dir(data.source_dir, data.dataset)
  files = 'download'
  if folder is not None:
    files = sorted((str(path.relative_to(folder)), _file_digest(str(path), path.stat().st_size,
                                                                 path.stat().st_mtime_ns))
                   for path in folder.rglob('*') if path.is_file())
  key = [data.dataset, data.dataset_config, str(cls.VERSION), files]
  if cls.LANGUAGES is None:  # one folder may hold more than two languages' files
    key.append(data.corpus_languages)
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


def _check_dataset_config(data_config) -> None:
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


def get_builder(data: 'DataSpec | _PreparedData', splits: Sequence[str] | None = None):
  """Returns the dataset's TFDS builder, preparing the data on first use.

  Args:
    data: the run's DataSpec.
    splits: Prepare only these splits, for a source known to lack the others
      (the offline IWSLT14 copy has no train files); None prepares all.

  Raises:
    ValueError: Unknown split.
    sources.SourceError: Raw files missing or unusable (first use only).
  """
  # A partial preparation lives apart so it never stands in for the full data.
  data_dir = data.cache_dir / 'tfds' / data.fingerprint
  if splits is not None:
    data_dir = data.cache_dir / 'tfds_partial' / data.fingerprint / '+'.join(sorted(splits))
  # TFDS prints its progress bars and messages to the terminal; they go to the log instead.
  tfds.disable_progress_bar()
  printed = io.StringIO()
  # Processes sharing the cache (sweep hosts, parallel runs) prepare it once: the first holds
  # the lock while preparing, the others then open the prepared data.
  with _exclusive(data_dir.with_name(data_dir.name + '.lock')), contextlib.redirect_stdout(printed):
    dataset_builder = builder_class(data.dataset)(
        config=data.dataset_config, data_dir=str(data_dir), source_dir=data.source_dir,
        download_dir=str(data.cache_dir / 'downloads'), splits=splits,
        languages=data.corpus_languages, file_format='array_record')
    dataset_builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  if printed.getvalue().strip():
    logging.info('%s', printed.getvalue().strip())
  return dataset_builder


def get_data_sources(data: DataSpec, splits: Sequence[str] | None = None) -> dict:
  """Returns split -> random-access TFDS data source (no TensorFlow needed).

  Records are dicts of `de`, `en`, `de_tok`, `en_tok` (bytes) and `index`;
  `load_examples` gives them as str in source order.
  """
  dataset_builder = get_builder(data, splits)
  return {split: dataset_builder.as_data_source(split=split)
          for split in splits or dataset_builder.SPLITS}


def load_examples(data: DataSpec, split: str) -> dict[str, list[str]]:
  """Returns field -> text of every example of `split`, in source order.

  Memoised per process, as reading a large split takes seconds.
  """
  check_split(data.dataset, split)
  return _load_examples(_PreparedData(data.dataset, data.dataset_config, data.source_dir,
                                      data.cache_dir, data.fingerprint, data.corpus_languages),
                        split)


def load_split_text(data: DataSpec, split: str) -> SplitText:
  """Returns the source, reference and tokenized reference text of `split`."""
  examples = load_examples(data, split)
  return SplitText(examples[data.source_lang], examples[data.target_lang],
                   examples[f'{data.target_lang}_tok'])


class _PreparedData(NamedTuple):
  """The fields of a DataSpec that identify prepared data (the memo's key)."""
  dataset: str
  dataset_config: str
  source_dir: str
  cache_dir: Path
  fingerprint: str
  corpus_languages: tuple[str, str]


@functools.lru_cache(maxsize=16)
def _load_examples(data: _PreparedData, split: str) -> dict[str, list[str]]:
  # Records are the tf.train.Example protos TFDS stores; parsing them with the
  # proto class TFDS ships is ~5x faster than its generic per-feature decoding
  # (1.4 s instead of 7 s for Multi30k's training split here).
  source = get_builder(data).as_data_source(
      split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
  records = source.__getitems__(range(len(source)))
  fields = builder.text_fields(data.corpus_languages)
  examples = {field: [''] * len(records) for field in fields}
  for record in records:
    features = tf_example_pb2.Example.FromString(record).features.feature
    index = features['index'].int64_list.value[0]
    for field in fields:
      examples[field][index] = features[field].bytes_list.value[0].decode()
  return examples
