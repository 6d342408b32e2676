"""Your own corpus (data/parallel_text.py): the same examples as Multi30k's builder on Multi30k's
files, any two language codes, streamed files checked line by line, and a run trained on it."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from data import datasets, sources
from training import trainer
from tests import data_fixtures
from tests.data_fixtures import multi30k_config  # pylint: disable=unused-import
from tests.test_train import smoke_config

# parallel_text split -> the Multi30k split of the same files.
SAME_FILES = {'train': 'train', 'validation': 'validation', 'test': 'test_2016'}


def _corpus(folder: Path, languages=('de', 'en'), rename=None) -> Path:
  """Multi30k's raw files as a parallel_text folder: train gzipped, the others plain; `rename`
  maps a Multi30k language to the code its files get."""
  folder.mkdir()
  raw = data_fixtures.data_root() / 'multi30k' / 'raw'
  stems = {'train': 'train', 'validation': 'val', 'test': 'test_2016_flickr'}
  for split, stem in stems.items():
    for lang in languages:
      code = (rename or {}).get(lang, lang)
      if split == 'train':
        shutil.copy(raw / f'{stem}.{lang}.gz', folder / f'train.{code}.gz')
      else:
        (folder / f'{split}.{code}').write_bytes(gzip.decompress((raw / f'{stem}.{lang}.gz').read_bytes()))
  return folder


def _spec(folder: Path, cache: Path, source='de', target='en', **overrides) -> datasets.DataSpec:
  return datasets.resolve(data_fixtures.data_config(
      dataset='parallel_text', source_dir=str(folder), cache_dir=str(cache), source_lang=source,
      target_lang=target, **overrides))


def test_the_same_files_give_the_examples_of_the_multi30k_builder(tmp_path, multi30k_config):
  own = _spec(_corpus(tmp_path / 'corpus'), tmp_path / 'cache')
  multi30k = datasets.resolve(multi30k_config)
  for split, multi30k_split in SAME_FILES.items():
    mine, theirs = datasets.load_examples(own, split), datasets.load_examples(multi30k, multi30k_split)
    assert mine['de'] == theirs['de'] and mine['en'] == theirs['en']
  # Multi30k's references were also punctuation-normalised; otherwise the forms agree.
  mine, theirs = (datasets.load_examples(own, 'test')['en_tok'],
                  datasets.load_examples(multi30k, 'test_2016')['en_tok'])
  assert sum(a == b for a, b in zip(mine, theirs)) > 0.95 * len(theirs)
  assert set(datasets.load_examples(own, 'train')['en_tok']) == {''}  # train needs no references


def test_any_language_codes_and_a_run_trained_on_them(tmp_path, data_cache):
  folder = _corpus(tmp_path / 'corpus', rename={'de': 'pt_br'})
  data = _spec(folder, tmp_path / 'cache', source='pt_br', target='en')
  assert data.corpus_languages == ('en', 'pt_br')
  assert sorted(datasets.load_examples(data, 'validation')) == ['en', 'en_tok', 'pt_br', 'pt_br_tok']
  config = smoke_config(data_cache, num_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  config.data.update(dataset='parallel_text', source_dir=str(folder), source_lang='pt_br',
                     target_lang='en', eval_examples=16)
  trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  records = [json.loads(line) for line in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert any('bleu' in record for record in records)


@pytest.mark.parametrize('damage,expected', [
    (lambda folder: (folder / 'validation.en').write_text('One .\nTwo .\n'),
     r'validation.en has 2 lines but .*validation.de has more'),
    (lambda folder: (folder / 'test.de').write_text('Eins .\n\nDrei .\n'), r'test.de: line 2 is empty'),
    (lambda folder: (folder / 'validation.de').write_bytes(b'Eins .\nZwei \xff.\n'),
     r'validation.de: line 2 is not valid UTF-8'),
    (lambda folder: (folder / 'test.en').unlink(), r'lacks 1 file\(s\): test.en.gz'),
])
def test_bad_files_stop_preparation_naming_the_file_and_line(tmp_path, damage, expected):
  folder = tmp_path / 'corpus'
  folder.mkdir()
  for split in ('train', 'validation', 'test'):
    (folder / f'{split}.de').write_text('Eins .\nZwei .\nDrei .\n')
    (folder / f'{split}.en').write_text('One .\nTwo .\nThree .\n')
  damage(folder)
  with pytest.raises(sources.SourceError, match=expected) as error:
    datasets.get_data_sources(_spec(folder, tmp_path / 'cache'))
  assert '\n' not in str(error.value)
  assert not list((tmp_path / 'cache').rglob('*.array_record*'))


def test_own_corpora_need_their_folder_and_two_language_codes(tmp_path):
  with pytest.raises(ValueError, match='set config.data.source_dir to their folder'):
    datasets.resolve(data_fixtures.data_config(dataset='parallel_text'))
  with pytest.raises(ValueError, match="'e n' is not a language code"):
    _spec(tmp_path, tmp_path / 'cache', source='e n')
  with pytest.raises(ValueError, match="source_lang and target_lang are both 'en'"):
    _spec(tmp_path, tmp_path / 'cache', source='en', target='en')
