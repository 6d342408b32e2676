"""Multi30k task 1 (Elliott et al., 2016), German-English, as a TFDS dataset.

Source layout (that of github.com/multi30k/dataset, data/task1), each file
gzipped or plain:
  raw/STEM.{de,en}.gz                original sentences
  tok/STEM.lc.norm.tok.{de,en}.gz    the authors' lowercased, normalised,
                                     Moses-tokenized sentences
"""

from pathlib import Path
from typing import Sequence

import tensorflow_datasets as tfds

from data import builder
from data import sources

# Split name -> file stem.
SPLIT_STEMS = {
    'train': 'train',
    'validation': 'val',
    'test_2016': 'test_2016_flickr',
    'test_2017': 'test_2017_flickr',
    'test_mscoco_2017': 'test_2017_mscoco',
    'test_2018': 'test_2018_flickr',
}
_URL = 'https://raw.githubusercontent.com/multi30k/dataset/master/data/task1'


def raw_name(split: str, lang: str) -> str:
  return f'raw/{SPLIT_STEMS[split]}.{lang}'


def tok_name(split: str, lang: str) -> str:
  return f'tok/{SPLIT_STEMS[split]}.lc.norm.tok.{lang}'


class Multi30k(builder.ParallelTextBuilder):
  """Multi30k task 1, de-en; `de`/`en` are raw or tokenized per the config."""

  name = 'multi30k'
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(
          name='original', description='`de`/`en` hold the original text.'),
      tfds.core.BuilderConfig(
          name='tokenized',
          description='`de`/`en` hold the lc.norm.tok text, like `*_tok`.'),
  ]
  SPLITS = tuple(SPLIT_STEMS)

  def _read_splits(self, folder: Path, splits: Sequence[str]):
    files = {}  # Split -> field -> file name.
    for split in splits:
      files[split] = {}
      for lang in builder.LANGUAGES:
        files[split][lang] = raw_name(split, lang)
        files[split][f'{lang}_tok'] = tok_name(split, lang)
    paths = sources.require_files(
        folder, [name for fields in files.values() for name in fields.values()],
        self.name)
    columns = {}
    for split, fields in files.items():
      lines = {field: sources.read_lines(paths[name])
               for field, name in fields.items()}
      sources.check_parallel(
          {str(paths[name]): lines[field] for field, name in fields.items()})
      if self.builder_config.name == 'tokenized':
        for lang in builder.LANGUAGES:
          lines[lang] = lines[f'{lang}_tok']
      columns[split] = lines
    return columns

  def _download(self, dest: Path) -> Path:
    # The repository keeps raw/ gzipped and tok/ as plain text.
    urls = {}
    for split in SPLIT_STEMS:
      for lang in builder.LANGUAGES:
        raw, tok = f'{raw_name(split, lang)}.gz', tok_name(split, lang)
        urls[raw], urls[tok] = f'{_URL}/{raw}', f'{_URL}/{tok}'
    return sources.download(urls, dest)
