"""IWSLT14 from a tiny de-en.tgz with the release's layout (fairseq's split)."""

import io
from pathlib import Path
import tarfile

import pytest

from data import datasets
from data import iwslt14_archive
from data import sources
from tests import data_fixtures

_HEADER = ('<url>http://www.ted.com/talks/{lang}</url>\n'
           '<keywords>talks, {lang}</keywords>\n'
           '<talkid>1</talkid>\n'
           '<title>Talk {lang}</title>\n'
           '<description>Summary {lang}.</description>\n')


def _train_pairs() -> list[tuple[str, str, str | None, str | None]]:
  """(de line, en line, expected de, expected en); None where cleaning drops."""
  pairs = [('Talk de', 'Talk en', 'talk de', 'talk en'),
           ('Summary de.', 'Summary en.', 'summary de .', 'summary en .')]
  for i in range(60):
    pairs.append((f'Satz  Nummer {i}.', f'Sentence number {i}.',
                  f'satz nummer {i} .', f'sentence number {i} .'))
  # German ordinals keep their period, except at the end of a line.
  pairs[5] = ('Am 3. Mai, Nummer 37.', 'On May 3, number 37.',
              'am 3. mai , nummer 37 .', 'on may 3 , number 37 .')
  pairs[10] = ('Ich & du.', "It's you.", 'ich &amp; du .', 'it &apos;s you .')
  pairs[20] = ('', 'Nothing on the left.', None, None)
  pairs[30] = (' '.join(['Wort'] * 176), ' '.join(['Word'] * 176), None, None)
  pairs[31] = (' '.join(['Wort'] * 175), ' '.join(['Word'] * 175),
               ' '.join(['wort'] * 175), ' '.join(['word'] * 175))
  pairs[40] = ('A b c d e f g', 'A b c d', None, None)  # Length ratio 7/4.
  pairs[41] = ('A b c d e f', 'A b c d', 'a b c d e f', 'a b c d')  # 6/4 = 1.5
  return pairs


def _test_segments(test_set: str, lang: str) -> list[str]:
  number = iwslt14_archive.TEST_SETS.index(test_set)
  return [f'{lang} {number} one.', f'{lang} {number} It’s two.']


def _expected_test_segments(test_set: str, lang: str) -> list[str]:
  number = iwslt14_archive.TEST_SETS.index(test_set)
  its = {'de': 'it &apos; s', 'en': 'it &apos;s'}[lang]
  return [f'{lang} {number} one .', f'{lang} {number} {its} two .']


def _xml(test_set: str, lang: str) -> str:
  segments = ''.join(f'<seg id="{i}"> {text} </seg>\n'
                     for i, text in enumerate(_test_segments(test_set, lang), 1))
  return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n'
          f'<srcset setid="{test_set}" srclang="english">\n<doc docid="1">\n'
          f'<talkid>1</talkid>\n<title>Ignored</title>\n{segments}'
          '</doc>\n</srcset>\n</mteval>\n')


def _write_archive(folder: Path, members: dict[str, str]) -> Path:
  folder.mkdir(parents=True, exist_ok=True)
  with tarfile.open(folder / iwslt14_archive.ARCHIVE, 'w:gz') as tar:
    for name, text in members.items():
      data = text.encode('utf-8')
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return folder


def _members() -> dict[str, str]:
  pairs = _train_pairs()
  members = {}
  for side, lang in enumerate(('de', 'en')):
    members[iwslt14_archive.train_member(lang)] = _HEADER.format(lang=lang) + (
        ''.join(f'{pair[side]}\n' for pair in pairs[2:]))
    for test_set in iwslt14_archive.TEST_SETS:
      members[iwslt14_archive.test_member(test_set, lang)] = _xml(test_set, lang)
  return members


def _config(tmp_path: Path, folder: Path, dataset_config: str = 'original'):
  return data_fixtures.data_config(
      dataset='iwslt14', dataset_config=dataset_config,
      source_dir=str(folder), cache_dir=str(tmp_path / 'cache'))


@pytest.mark.parametrize('dataset_config', ['original', 'tokenized'])
def test_archive_gives_fairseqs_cleaned_split(tmp_path, dataset_config):
  folder = _write_archive(tmp_path / 'iwslt14', _members())
  config = _config(tmp_path, folder, dataset_config)
  kept = [(de, en) for _, _, de, en in _train_pairs() if de is not None]
  valid = kept[iwslt14_archive.VALID_EVERY - 1::iwslt14_archive.VALID_EVERY]
  train = [pair for i, pair in enumerate(kept, 1)
           if i % iwslt14_archive.VALID_EVERY]
  test = [pair for test_set in iwslt14_archive.TEST_SETS
          for pair in zip(_expected_test_segments(test_set, 'de'),
                          _expected_test_segments(test_set, 'en'))]
  for split, expected in (('train', train), ('validation', valid),
                          ('test', test)):
    examples = datasets.load_examples(datasets.resolve(config), split)
    assert list(zip(examples['de_tok'], examples['en_tok'])) == expected, split
  assert (len(train), len(valid), len(test)) == (57, 2, 10)

  examples = datasets.load_examples(datasets.resolve(config), 'train')
  if dataset_config == 'tokenized':
    assert examples['en'] == examples['en_tok']
  else:
    assert examples['de'][2] == 'satz nummer 0.'
    assert examples['en'][10] == "it's you."


def test_archive_missing_member(tmp_path):
  members = _members()
  del members['de-en/IWSLT14.TED.tst2011.de-en.en.xml']
  folder = _write_archive(tmp_path / 'iwslt14', members)
  with pytest.raises(FileNotFoundError,
                     match='lacks 1 member.*IWSLT14.TED.tst2011.de-en.en.xml'):
    datasets.get_data_sources(datasets.resolve(_config(tmp_path, folder)))


def test_archive_misaligned_training_text(tmp_path):
  members = _members()
  members['de-en/train.tags.de-en.en'] += 'One line too many.\n'
  folder = _write_archive(tmp_path / 'iwslt14', members)
  with pytest.raises(sources.SourceError, match='train.tags.de-en.en .* has 63 '
                     'lines but .*train.tags.de-en.de .* has 62'):
    datasets.get_data_sources(datasets.resolve(_config(tmp_path, folder)))
