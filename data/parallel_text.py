"""Any parallel corpus as a TFDS dataset: `config.data.dataset='parallel_text'`.

Source layout, in config.data.source_dir, each file gzipped (name ending .gz) or plain UTF-8 text,
line i of one language translating line i of the other:
  train.SRC       train.TGT
  validation.SRC  validation.TGT
  test.SRC        test.TGT
where SRC and TGT are config.data.source_lang and target_lang (any codes: 'en', 'fr', 'pt_br').
One folder may hold more languages; each pair is prepared apart.

Files are read line by line as the records are written, so preparing a corpus of millions of
pairs holds no list of it in memory. Every file is looked for before anything is written; a bad
byte, an empty line or files of different lengths stop preparation naming the file and line.
The evaluation splits also get `<language>_tok`: their Moses-tokenized, lowercased form, the
references of eval.py's "tokenized BLEU" (hypotheses are tokenized alike).
"""

import contextlib
import gzip
import itertools
from pathlib import Path
from typing import Iterator
import zlib

import sacremoses
import tensorflow_datasets as tfds

from data import builder
from data import sources

SPLITS = ('train', 'validation', 'test')


class ParallelText(builder.ParallelTextBuilder):
  """Two line-aligned files per split, in any two languages (config.data.source_lang/target_lang)."""

  name = 'parallel_text'
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(
      name='original', description='`<language>` fields hold the files\' lines as they are.')]
  SPLITS = SPLITS
  LANGUAGES = None

  def _split_examples(self, folder: Path) -> dict[str, Iterator]:
    names = {(split, lang): f'{split}.{lang}' for split in self._splits for lang in self.languages}
    paths = sources.require_files(folder, list(names.values()), self.name)
    return {split: self._stream({lang: paths[names[split, lang]] for lang in self.languages},
                                with_references=split != 'train')
            for split in self._splits}

  def _stream(self, paths: dict[str, Path], with_references: bool) -> Iterator:
    """Yields (index, example) from the files of one split, checking them as it reads."""
    tokenizers = {lang: sacremoses.MosesTokenizer(lang=lang) for lang in paths}
    with contextlib.ExitStack() as stack:
      files = [stack.enter_context(_lines(path)) for path in paths.values()]
      index = -1
      for index, lines in enumerate(itertools.zip_longest(*files)):
        if None in lines:
          short = list(paths.values())[lines.index(None)]
          raise sources.SourceError(
              f'{short} has {index} lines but {_other(paths, short)} has more; line i of each must '
              'translate line i of the other')
        example = {'index': index}
        for (lang, path), text in zip(paths.items(), lines):
          if not text.strip():
            raise sources.SourceError(f'{path}: line {index + 1} is empty')
          example[lang] = text
          example[f'{lang}_tok'] = (tokenizers[lang].tokenize(text, escape=True, return_str=True)
                                    .lower() if with_references else '')
        yield index, example
      if index < 0:
        raise sources.SourceError(f'{list(paths.values())[0]} is empty')

  def _download(self, dest: Path) -> Path:
    raise sources.MissingSourceError(
        f'{self.name}: set config.data.source_dir to the folder of the corpus files (train, '
        f'validation and test, each .{" and .".join(self.languages)}); there is nothing to download')


def _other(paths: dict[str, Path], path: Path) -> Path:
  return next(other for other in paths.values() if other != path)


@contextlib.contextmanager
def _lines(path: Path) -> Iterator[Iterator[str]]:
  """The lines of `path` (gzipped when its name ends in .gz) as text without their '\\n', read as
  they are used; a bad byte or a truncated gzip file raises SourceError naming the file and line."""
  opener = gzip.open if path.suffix == '.gz' else open
  with opener(path, 'rb') as file:
    def decoded():
      number = 0
      try:
        for number, raw in enumerate(file, start=1):
          # Only '\n' ends a line, as in sources.decode_lines.
          yield (raw[:-1] if raw.endswith(b'\n') else raw).decode('utf-8')
      except UnicodeDecodeError as error:
        raise sources.SourceError(f'{path}: line {number} is not valid UTF-8 ({error.reason})') from None
      except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise sources.SourceError(f'{path} is not a complete gzip file ({type(error).__name__}: '
                                  f'{error}); copy it again') from None
    yield decoded()
