"""Every bad input gives one clear, one-line error before any data is written."""

import gzip
import os
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from configs import base
from data import datasets
from data import sources
from data import tokenizer as tokenizer_lib
from tests import data_fixtures
from tests.data_fixtures import multi30k_config  # pylint: disable=unused-import
from training import config_checks


def _prepare_error(tmp_path: Path, source: Path, expected: type, **overrides):
  """Prepares from `source`, returning the error's message; checks nothing was written."""
  config = data_fixtures.data_config(
      source_dir=str(source), cache_dir=str(tmp_path / 'cache'), **overrides)
  with pytest.raises(expected) as error:
    datasets.get_data_sources(datasets.resolve(config))
  message = str(error.value)
  assert '\n' not in message
  assert not list((tmp_path / 'cache').rglob('*.array_record*'))
  return message


def _rewrite(path: Path, content: bytes) -> None:
  with gzip.open(path, 'wb') as f:
    f.write(content)


def test_missing_folder(tmp_path):
  message = _prepare_error(tmp_path, tmp_path / 'nowhere',
                           sources.MissingSourceError)
  assert str(tmp_path / 'nowhere') in message


def test_missing_folder_under_the_environment_root(tmp_path, monkeypatch):
  monkeypatch.setenv(sources.ENV_VAR, str(tmp_path))
  config = data_fixtures.data_config(cache_dir=str(tmp_path / 'cache'))
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'multi30k')):
    datasets.get_data_sources(datasets.resolve(config))


def test_missing_file_names_the_exact_file(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  (source / 'raw' / 'val.en.gz').unlink()
  (source / 'tok' / 'test_2018_flickr.lc.norm.tok.de.gz').unlink()
  message = _prepare_error(tmp_path, source, FileNotFoundError)
  assert str(source) in message
  assert 'raw/val.en.gz' in message
  assert 'tok/test_2018_flickr.lc.norm.tok.de.gz' in message
  assert 'raw/val.de.gz' not in message


def test_mismatched_line_counts(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  _rewrite(source / 'raw' / 'train.en.gz', b'one\ntwo\nthree\nfour\n')
  message = _prepare_error(tmp_path, source, sources.SourceError)
  assert 'train.en.gz has 4 lines' in message
  assert 'train.de.gz has 3' in message


def test_empty_file(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  _rewrite(source / 'tok' / 'val.lc.norm.tok.de.gz', b'')
  message = _prepare_error(tmp_path, source, sources.SourceError)
  assert message == f'{source}/tok/val.lc.norm.tok.de.gz is empty'


def test_empty_line(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  _rewrite(source / 'raw' / 'test_2016_flickr.de.gz', b'eins\n \ndrei\n')
  message = _prepare_error(tmp_path, source, sources.SourceError)
  assert message == f'{source}/raw/test_2016_flickr.de.gz: line 2 is empty'


def test_undecodable_bytes(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  _rewrite(source / 'raw' / 'train.de.gz', b'eins\nzwei\ndr\xffei\n')
  message = _prepare_error(tmp_path, source, sources.SourceError)
  assert message.startswith(
      f'{source}/raw/train.de.gz: line 3 is not valid UTF-8')


def test_iwslt14_without_text_or_archive(tmp_path):
  (tmp_path / 'iwslt14').mkdir()
  message = _prepare_error(tmp_path, tmp_path / 'iwslt14', FileNotFoundError,
                           dataset='iwslt14')
  assert 'train.de.gz, train.en.gz, valid.de.gz' in message
  assert 'de-en.tgz' in message


def test_unknown_split(multi30k_config):
  with pytest.raises(ValueError, match="Unknown multi30k split 'test'; valid: "
                     'train, validation, test_2016, test_2017, '
                     'test_mscoco_2017, test_2018'):
    datasets.load_split_text(datasets.resolve(multi30k_config), 'test')


def test_unknown_dataset():
  config = data_fixtures.data_config(dataset='wmt14')
  with pytest.raises(ValueError, match="Unknown dataset 'wmt14'; valid: "
                     'multi30k, iwslt14'):
    datasets.get_data_sources(datasets.resolve(config))


def test_unknown_dataset_config():
  config = data_fixtures.data_config(dataset_config='cased')
  with pytest.raises(ValueError, match='valid: original, tokenized'):
    datasets.get_data_sources(datasets.resolve(config))


def test_unknown_vocab_type():
  config = data_fixtures.data_config(vocab_type='wordpiece')
  with pytest.raises(ValueError, match='valid: unigram, bpe'):
    tokenizer_lib.get_tokenizer(datasets.resolve(config))


def test_languages_must_be_the_pair():
  config = data_fixtures.data_config(source_lang='de', target_lang='fr')
  with pytest.raises(ValueError, match="must be the two languages"):
    datasets.resolve(config)



def test_truncated_gzip_names_the_file(tmp_path):
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k', lines_per_split=200)
  path = source / 'raw' / 'train.de.gz'
  path.write_bytes(path.read_bytes()[:-40])
  message = _prepare_error(tmp_path, source, sources.SourceError)
  assert str(path) in message and 'not a complete gzip file' in message


def test_copied_or_touched_source_files_keep_their_fingerprint(tmp_path):
  """The same bytes under new modification times (a copy, a re-extracted archive) are the same data:
  prepared data is reused and a run may resume. Same-size edits still change the fingerprint."""
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  config = data_fixtures.data_config(source_dir=str(source), cache_dir=str(tmp_path / 'cache'))
  before = datasets.resolve(config).fingerprint

  copy = tmp_path / 'copy' / 'multi30k'
  shutil.copytree(source, copy, copy_function=shutil.copyfile)  # new modification times
  config.source_dir = str(copy)
  assert datasets.resolve(config).fingerprint == before
  path = copy / 'raw' / 'val.en.gz'
  os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
  assert datasets.resolve(config).fingerprint == before

  data = bytearray(path.read_bytes())
  data[-1] ^= 1  # same size, one bit different
  path.write_bytes(bytes(data))
  assert datasets.resolve(config).fingerprint != before


def test_edited_or_other_source_files_are_prepared_afresh(tmp_path):
  """Prepared data, tokenizers and token ids are keyed by the raw files, never reused stale."""
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  config = data_fixtures.data_config(source_dir=str(source), cache_dir=str(tmp_path / 'cache'))
  validation = datasets.load_examples(datasets.resolve(config), 'validation')
  assert validation['en'][0] == 'En Validation Sentence 0 .'
  before = datasets.resolve(config).fingerprint

  _rewrite(source / 'raw' / 'val.en.gz', b'An edited line .\nTwo .\nThree .\n')
  assert datasets.resolve(config).fingerprint != before
  validation = datasets.load_examples(datasets.resolve(config), 'validation')
  assert validation['en'] == ['An edited line .', 'Two .', 'Three .']

  other = data_fixtures.write_multi30k(tmp_path / 'other')
  _rewrite(other / 'raw' / 'train.en.gz', b'one\ntwo\nthree\nfour\n')
  config.source_dir = str(other)
  with pytest.raises(sources.SourceError, match='train.en.gz has 4 lines'):
    datasets.load_examples(datasets.resolve(config), 'train')


@pytest.mark.parametrize('overrides, message', [
    ({'subword_samples': -1}, 'config.data.subword_samples=-1 must be 0'),
    ({'subword_samples': 4, 'subword_nbest': 1}, 'config.data.subword_nbest=1 must be -1'),
    ({'subword_samples': 4, 'subword_alpha': 0.0}, 'config.data.subword_alpha=0.0 must be positive'),
    ({'subword_samples': 4, 'vocab_type': 'bpe', 'subword_alpha': 1.5},
     "config.data.subword_alpha=1.5 is BPE-dropout's merge dropout probability"),
])
def test_bad_subword_sampling_is_named_before_anything_is_built(overrides, message):
  config = base.get_config()
  config.data.update(overrides)
  with pytest.raises(ValueError, match=message) as error:
    config_checks.check_config(config)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('section, name', [
    ('data', 'max_tokens'), ('data', 'pack_length'), ('data', 'train_max_source_words'),
    ('data', 'subword_samples'), ('data', 'eval_examples'), ('data', 'num_workers'),
    ('train', 'save_on_stop_after'), ('train', 'num_steps'), ('train', 'num_epochs'),
    ('optim', 'warmup_steps'),
])
def test_a_count_given_as_true_is_refused_not_read_as_one(section, name):
  """bool is a subclass of int: a stray flag `=True` must not pass as a count of 1."""
  config = base.get_config()
  config[section][name] = True
  with pytest.raises(ValueError, match=rf'^config\.{section}\.{name}=True must be '):
    config_checks.check_config(config)


def test_a_data_spec_reads_no_file_until_its_fingerprint_is_asked(tmp_path):
  """eval.py --input translates with a run's vocabularies alone: resolving config.data must not
  need the raw files, and the fingerprint then names the missing folder in one line."""
  config = data_fixtures.data_config(source_dir=str(tmp_path / 'absent'),
                                     cache_dir=str(tmp_path / 'cache'))
  data = datasets.resolve(config)
  assert (data.languages, data.cache_dir) == (('de', 'en'), tmp_path / 'cache')
  with pytest.raises(sources.MissingSourceError, match='absent'):
    data.fingerprint
  with pytest.raises(AttributeError):
    data.vocab_size = 5  # frozen: what a run resolved stays what it resolved


def test_a_data_spec_names_the_files_the_caches_write(tmp_path):
  """Tokenizer and token-id files carry the raw files' fingerprint and the vocabulary settings, so
  edited data or another vocabulary never meets a stale cache."""
  source = data_fixtures.write_multi30k(tmp_path / 'raw')
  data = datasets.resolve(data_fixtures.data_config(source_dir=str(source),
                                                    cache_dir=str(tmp_path / 'cache')))
  assert data.tokenizer_file().name == f'multi30k-original-{data.fingerprint}-bpe-1000.model'
  assert data.tokenizer_file('de').name.endswith('-bpe-1000-de.model')
  assert data.token_ids_dir('abc').parent == tmp_path / 'cache' / 'token_ids'
  separate = datasets.resolve(data_fixtures.data_config(
      source_dir=str(source), cache_dir=str(tmp_path / 'cache'), vocabulary='separate'))
  assert (data.model_languages, separate.model_languages) == ({'de': None, 'en': None},
                                                              {'de': 'de', 'en': 'en'})


def test_a_failed_download_is_one_line_naming_the_url_and_leaves_nothing(tmp_path, monkeypatch):
  def unreachable(url, filename):
    Path(filename).write_bytes(b'half a file')  # what an interrupted transfer leaves
    raise urllib.error.URLError(socket.gaierror(-2, 'Name or service not known'))

  monkeypatch.setattr(urllib.request, 'urlretrieve', unreachable)
  url = 'https://example.org/train.de.gz'
  with pytest.raises(sources.MissingSourceError) as error:
    sources.download({'data/train.de.gz': url}, tmp_path)
  message = str(error.value)
  assert '\n' not in message
  assert url in message and 'Name or service not known' in message
  assert sources.ENV_VAR in message and 'config.data.source_dir' in message
  assert not [p for p in tmp_path.rglob('*') if p.is_file()]
