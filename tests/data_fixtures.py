"""Shared helpers of the data tests: the local data copy, configs, fake sources.

The expensive steps (preparing Multi30k, training a tokenizer) run once per test
session however many test modules ask for them: a fixture imported into several
modules is registered once per module, so the work is memoised in plain
functions keyed by the session's temporary folder, and the fixtures hand it out.
"""

import functools
import gzip
import os
from pathlib import Path

import pytest

from configs import base
from data import datasets
from data import multi30k
from data import sources
from data import tokenizer as tokenizer_lib
from data import vocabularies as vocabularies_lib

# Small vocabulary and the faster trainer: tokenizer-dependent tests stay fast.
TEST_VOCAB_SIZE = 1000
TEST_VOCAB_TYPE = 'bpe'


def data_root() -> Path:
  """The local data copy: $SEQ2SEQ_DATA_DIR, else ../shared/data of the repo."""
  root = Path(os.environ.get(sources.ENV_VAR) or
              Path(__file__).resolve().parents[2] / 'shared' / 'data')
  if not (root / 'multi30k').is_dir() or not (root / 'iwslt14').is_dir():
    pytest.fail(f'Data tests need the local data copy with multi30k/ and '
                f'iwslt14/ in {root}; set ${sources.ENV_VAR} to its folder')
  return root


def data_config(**overrides):
  """A fresh `config.data` of configs/base.py with `overrides` applied."""
  config = base.get_config().data
  config.vocab_size = TEST_VOCAB_SIZE
  config.vocab_type = TEST_VOCAB_TYPE
  config.update(overrides)
  return config


def shared_cache_dir(tmp_path_factory) -> Path:
  """The prepared-data cache of this test session, shared by its xdist workers.

  Each worker has its own temporary folder under the session's; the cache sits beside them, so
  Multi30k is prepared once, not once per worker. Concurrent preparation is safe: datasets are
  built under a file lock, tokenizers and token ids renamed into place (data/datasets.py).
  """
  session_temp = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    session_temp = session_temp.parent
  return session_temp / 'seq2seq_cache'


def _multi30k_config(cache_dir: Path):
  """Real Multi30k, cached in `cache_dir`."""
  return data_config(source_dir=str(data_root() / 'multi30k'), cache_dir=str(cache_dir))


@functools.cache
def _tokenizer(cache_dir: Path) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.get_tokenizer(datasets.resolve(_multi30k_config(cache_dir)))


@functools.cache
def _vocabularies(cache_dir: Path) -> vocabularies_lib.Vocabularies:
  return vocabularies_lib.get_vocabularies(datasets.resolve(_multi30k_config(cache_dir)))


@pytest.fixture
def multi30k_config(tmp_path_factory):
  """`config.data` of the real Multi30k; prepared on first use in a session."""
  return _multi30k_config(shared_cache_dir(tmp_path_factory))


@pytest.fixture
def multi30k_tokenizer(tmp_path_factory) -> tokenizer_lib.Tokenizer:
  """The test vocabulary trained on the real Multi30k, once per session."""
  return _tokenizer(shared_cache_dir(tmp_path_factory))


@pytest.fixture
def multi30k_vocabularies(tmp_path_factory) -> vocabularies_lib.Vocabularies:
  """`multi30k_tokenizer` as the vocabularies of a De->En run (one joint vocabulary)."""
  return _vocabularies(shared_cache_dir(tmp_path_factory))


def read_gzip_lines(path: Path) -> list[str]:
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return f.read().split('\n')[:-1]


def write_multi30k(folder: Path, lines_per_split: int = 3) -> Path:
  """Writes a tiny, valid Multi30k source folder (every split, raw and tok)."""
  for split in multi30k.SPLIT_STEMS:
    for lang in ('de', 'en'):
      for name, case in ((multi30k.raw_name, str.title),
                         (multi30k.tok_name, str.lower)):
        path = folder / f'{name(split, lang)}.gz'
        path.parent.mkdir(parents=True, exist_ok=True)
        text = ''.join(f'{case(f"{lang} {split} sentence {i}")} .\n'
                       for i in range(lines_per_split))
        with gzip.open(path, 'wt', encoding='utf-8') as f:
          f.write(text)
  return folder

