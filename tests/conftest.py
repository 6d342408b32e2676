"""Shared test setup: where the local dataset copy is, and one prepared-data cache per session."""

import os
import tempfile
from pathlib import Path

import pytest

from tests.sweep_fixtures import NO_LLVM_OPTIMISATION

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
# LLVM's optimisation off for the session and the processes it starts: the tests compile many small
# programs and run each for a few steps, so compiling dominates (see tests/sweep_fixtures.py).
if NO_LLVM_OPTIMISATION not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {NO_LLVM_OPTIMISATION}".strip()

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


# The files that take longest on a 2-core CPU (`pytest --durations=0`, summed per file), longest
# first. xdist hands whole files to its workers as they come free (pyproject.toml: --dist loadfile,
# --no-loadscope-reorder); long files left to the end would keep one worker busy while the other
# sits idle. The other files follow in their usual order.
_LONGEST_FILES_FIRST = (
    'test_eval.py', 'test_train.py', 'test_members.py', 'test_transformer.py', 'test_scaling.py',
    'test_sweep.py', 'test_microbatch.py', 'test_length_extrapolation.py', 'test_parallel.py',
    'test_slurm.py', 'test_vocabularies.py', 'test_analyses.py', 'test_reliability.py', 'test_fusion.py',
    'test_component_matrix.py', 'test_failures.py', 'test_packing.py', 'test_configs.py',
    'test_decoding.py')


def pytest_collection_modifyitems(items):
  rank = {name: position for position, name in enumerate(_LONGEST_FILES_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order
