"""TFDS builders on the local data copy: split sizes, alignment, fields."""

import tempfile

import pytest

from data import datasets
from data import sources
from tests import data_fixtures
from tests.data_fixtures import multi30k_config  # pylint: disable=unused-import

MULTI30K_SIZES = {
    'train': 29000,
    'validation': 1014,
    'test_2016': 1000,
    'test_2017': 1000,
    'test_mscoco_2017': 461,
    'test_2018': 1071,
}


@pytest.mark.parametrize('dataset_config', ['original', 'tokenized'])
def test_multi30k_split_sizes(multi30k_config, dataset_config):
  multi30k_config.dataset_config = dataset_config
  data_sources = datasets.get_data_sources(datasets.resolve(multi30k_config))
  assert {split: len(source) for split, source in data_sources.items()} == (
      MULTI30K_SIZES)


def test_multi30k_pairs_are_aligned_with_the_files(multi30k_config):
  folder = data_fixtures.data_root() / 'multi30k'
  train = datasets.load_examples(datasets.resolve(multi30k_config), 'train')
  for field, path in [('de', 'raw/train.de.gz'), ('en', 'raw/train.en.gz'),
                      ('de_tok', 'tok/train.lc.norm.tok.de.gz'),
                      ('en_tok', 'tok/train.lc.norm.tok.en.gz')]:
    lines = data_fixtures.read_gzip_lines(folder / path)
    for index in (0, 1, 12345, 28999):
      assert train[field][index] == lines[index], (field, index)
  assert train['de'][0] == (
      'Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.')
  assert train['en'][0] == 'Two young, White males are outside near many bushes.'


def test_records_carry_all_fields_and_the_line_index(multi30k_config):
  source = datasets.get_data_sources(datasets.resolve(multi30k_config))['test_2016']
  record = source[7]
  assert set(record) == {'de', 'en', 'de_tok', 'en_tok', 'index'}
  assert int(record['index']) == 7
  examples = datasets.load_examples(datasets.resolve(multi30k_config), 'test_2016')
  assert all(isinstance(text, str) for text in examples['en'])
  assert examples['en'][7] == record['en'].decode('utf-8')


def test_multi30k_tokenized_config_reads_the_tok_files(multi30k_config):
  multi30k_config.dataset_config = 'tokenized'
  validation = datasets.load_examples(datasets.resolve(multi30k_config), 'validation')
  assert validation['de'] == validation['de_tok']
  assert validation['en'][0] == 'a group of men are loading cotton onto a truck'


def test_load_split_text_follows_the_direction(multi30k_config):
  multi30k_config.source_lang, multi30k_config.target_lang = 'en', 'de'
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'validation')
  examples = datasets.load_examples(datasets.resolve(multi30k_config), 'validation')
  assert text.source == examples['en']
  assert text.reference == examples['de']
  assert text.reference_tokenized == examples['de_tok']


def test_iwslt14_valid_and_test_from_the_tok_folder(tmp_path):
  folder = data_fixtures.data_root() / 'iwslt14'
  config = data_fixtures.data_config(
      dataset='iwslt14', source_dir=str(folder), cache_dir=str(tmp_path))
  data_sources = datasets.get_data_sources(datasets.resolve(config),
                                           splits=('validation', 'test'))
  assert {split: len(s) for split, s in data_sources.items()} == {
      'validation': 7283, 'test': 6750}
  for index in (0, 7282):
    record = data_sources['validation'][index]
    for field, subfolder in (('de_tok', 'tok'), ('de', 'detok')):
      lines = data_fixtures.read_gzip_lines(folder / subfolder / 'valid.de.gz')
      assert record[field].decode('utf-8') == lines[index]
  assert data_sources['validation'][0]['en_tok'] == b'it &apos;s that pyramid .'
  assert data_sources['validation'][0]['en'] == b"it's that pyramid."


def test_source_folder_comes_from_config_then_environment(monkeypatch,
                                                          tmp_path):
  configured = data_fixtures.write_multi30k(tmp_path / 'configured')
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path / 'root'))
  from_env = data_fixtures.write_multi30k(tmp_path / 'root' / 'multi30k')
  assert sources.resolve_source_dir(str(configured), 'multi30k') == configured
  assert sources.resolve_source_dir('', 'multi30k') == from_env
  monkeypatch.delenv(sources.ENV_VAR)
  assert sources.resolve_source_dir('', 'multi30k') is None  # Download.


def test_prepares_from_the_environment_variable(monkeypatch, tmp_path):
  data_fixtures.write_multi30k(tmp_path / 'root' / 'multi30k', lines_per_split=4)
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path / 'root'))
  config = data_fixtures.data_config(cache_dir=str(tmp_path / 'cache'))
  data_sources = datasets.get_data_sources(datasets.resolve(config))
  assert {len(source) for source in data_sources.values()} == {4}
  assert datasets.load_examples(datasets.resolve(config), 'test_2018')['en'][3] == (
      'En Test_2018 Sentence 3 .')


def test_preparing_leaves_no_folder_in_the_temporary_directory(monkeypatch, tmp_path):
  # tfds' DatasetInfo.initialize_from_bucket, run whenever a builder is made for a dataset not
  # yet prepared, makes a temporary folder and leaves it behind empty: one per run and per test.
  scratch = tmp_path / 'scratch'
  scratch.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(scratch))
  data_fixtures.write_multi30k(tmp_path / 'root' / 'multi30k', lines_per_split=2)
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path / 'root'))
  config = data_fixtures.data_config(cache_dir=str(tmp_path / 'cache'))
  data_sources = datasets.get_data_sources(datasets.resolve(config))
  assert {len(source) for source in data_sources.values()} == {2}
  assert not list(scratch.iterdir())
