"""Shared test setup: where the local dataset copy is, and one prepared-data cache per session."""

import os
import tempfile
from pathlib import Path

import pytest

# The local Multi30k/IWSLT14 copy beside the repository (../shared/data), unless the
# environment names another; subprocesses started by tests inherit the variable.
_DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / 'shared' / 'data'
os.environ.setdefault('SEQ2SEQ_DATA_DIR', str(_DEFAULT_DATA_DIR))
# Progress bars off, as on CI.
os.environ.setdefault('CI', '1')
# One persistent XLA compilation cache for the session and the train.py subprocesses it starts:
# the same smoke-model step is compiled in several tests.
_COMPILATION_CACHE = Path(tempfile.gettempdir()) / f'seq2seq_lab_test_xla_cache_{os.getuid()}'
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', str(_COMPILATION_CACHE))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')

# After the environment above: it imports the data library, hence jax.
from tests.data_fixtures import shared_cache_dir  # pylint: disable=wrong-import-position

if not (Path(os.environ['SEQ2SEQ_DATA_DIR']) / 'multi30k').is_dir():
  raise pytest.UsageError(f'SEQ2SEQ_DATA_DIR={os.environ["SEQ2SEQ_DATA_DIR"]} holds no multi30k/ folder; '
                          'point it at the local dataset copy (see README)')


@pytest.fixture(scope='session')
def data_cache(tmp_path_factory) -> Path:
  """Prepared TFDS data and tokenizers, built once and shared by every test that trains."""
  # The folder tests/data_fixtures.py uses too, so data and tokenizers are prepared once.
  path = shared_cache_dir(tmp_path_factory)
  path.mkdir(exist_ok=True)
  return path
