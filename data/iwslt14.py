"""IWSLT14 German-English in fairseq's split, as a TFDS dataset.

The source folder holds either
  de-en.tgz                  the 2014 campaign's release, cleaned and split here
                             like fairseq's prepare-iwslt14.sh (iwslt14_archive);
or fairseq-prepared text (the tokenized, lowercased text before BPE), gzipped
or plain, directly in the folder or in its tok/ subfolder:
  {train,valid,test}.{de,en}
  detok/{train,valid,test}.{de,en}   optional, next to tok/: detokenized forms.

`de_tok`/`en_tok` are the fairseq text (what "tokenized BLEU" on IWSLT14 is
scored against). `de`/`en` hold the same text Moses-detokenized (read from
detok/ when present) in the `original` config, and the fairseq text itself in
the `tokenized` config.
"""

from pathlib import Path
from typing import Sequence

import sacremoses
import tensorflow_datasets as tfds

from data import builder
from data import iwslt14_archive
from data import sources

# Split name -> file stem of fairseq's output.
SPLIT_FILES = {'train': 'train', 'validation': 'valid', 'test': 'test'}
# Where prepare-iwslt14.sh downloads the release from.
_URL = 'https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz'


class Iwslt14(builder.ParallelTextBuilder):
  """IWSLT14 de-en, lowercased, split as in fairseq's prepare-iwslt14.sh."""

  name = 'iwslt14'
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(
          name='original',
          description='`de`/`en` hold detokenized (lowercased) text.'),
      tfds.core.BuilderConfig(
          name='tokenized',
          description='`de`/`en` hold the fairseq tokenized text, like `*_tok`.'),
  ]
  SPLITS = tuple(SPLIT_FILES)

  def _read_splits(self, folder: Path, splits: Sequence[str]):
    archive = folder / iwslt14_archive.ARCHIVE
    if archive.is_file():
      tokenized, detokenized = iwslt14_archive.read_archive(archive, splits), {}
    else:
      tokenized, detokenized = _read_text_files(folder, splits)
    columns = {}
    for split in splits:
      lines = {f'{lang}_tok': tokenized[split][lang]
               for lang in builder.LANGUAGES}
      for lang in builder.LANGUAGES:
        if self.builder_config.name == 'tokenized':
          lines[lang] = lines[f'{lang}_tok']
        elif split in detokenized:
          lines[lang] = detokenized[split][lang]
        else:
          detokenizer = sacremoses.MosesDetokenizer(lang=lang)
          lines[lang] = [detokenizer.detokenize(line.split())
                         for line in lines[f'{lang}_tok']]
      columns[split] = lines
    return columns

  def _download(self, dest: Path) -> Path:
    return sources.download({iwslt14_archive.ARCHIVE: _URL}, dest)


def _read_text_files(folder: Path, splits: Sequence[str]):
  """Reads fairseq text (and detok/ when present) for `splits`.

  Returns:
    Two mappings split -> language -> lines: tokenized and detokenized (empty
    without a detok/ folder).
  """
  tok_dir = folder / 'tok' if (folder / 'tok').is_dir() else folder
  detok_dir = folder / 'detok'
  names = [f'{SPLIT_FILES[split]}.{lang}' for split in splits
           for lang in builder.LANGUAGES]
  tok_paths = sources.require_files(
      tok_dir, names, 'iwslt14',
      hint=f'or put the release {iwslt14_archive.ARCHIVE} in {folder}')
  detok_paths = {}
  if tok_dir != folder and detok_dir.is_dir():
    detok_paths = sources.require_files(detok_dir, names, 'iwslt14')
  tokenized, detokenized = {}, {}
  for split in splits:
    files = {lang: tok_paths[f'{SPLIT_FILES[split]}.{lang}']
             for lang in builder.LANGUAGES}
    files.update({f'detok_{lang}': detok_paths[f'{SPLIT_FILES[split]}.{lang}']
                  for lang in builder.LANGUAGES if detok_paths})
    lines = {key: sources.read_lines(path) for key, path in files.items()}
    sources.check_parallel({str(files[key]): lines[key] for key in files})
    tokenized[split] = {lang: lines[lang] for lang in builder.LANGUAGES}
    if detok_paths:
      detokenized[split] = {lang: lines[f'detok_{lang}']
                            for lang in builder.LANGUAGES}
  return tokenized, detokenized
