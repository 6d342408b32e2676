"""TFDS builder shared by the parallel-text datasets.

Each example carries both directions and the reference forms eval scores against: one text
field per language (`de`, `en`: the text models read), `<language>_tok` (the tokenized text of
"tokenized BLEU") and `index`, the example's line number in its split, so hypotheses can be
written back in source order.

The data is written as ArrayRecord and read with `as_data_source`, which needs
no TensorFlow. Subclasses say where the files are and how to read them.
"""

import abc
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from data import sources

# The languages of Multi30k and IWSLT14.
LANGUAGES = ('de', 'en')


def text_fields(languages: Sequence[str]) -> tuple[str, ...]:
  """Text fields of every example of a corpus of `languages` (sorted), in the order builders fill
  them: ('de', 'en', 'de_tok', 'en_tok') for de-en."""
  return (*languages, *(f'{lang}_tok' for lang in languages))

Columns = Mapping[str, list[str]]


class _LocalDatasetInfo(tfds.core.DatasetInfo):
  """DatasetInfo of a dataset that tfds' GCS bucket never holds.

  The parent's `initialize_from_bucket`, run whenever a builder is made for a dataset not yet
  prepared, makes a temporary folder before it finds the bucket disabled and leaves the folder
  behind, empty (tfds 4.9): one per run, evaluation and test. With nothing to fetch, it does
  nothing here.
  """

  def initialize_from_bucket(self) -> None:
    pass


class ParallelTextBuilder(tfds.core.GeneratorBasedBuilder):
  """Builds every split of a de-en corpus from raw files.

  Subclasses set `SPLITS` and implement `_download`, and either `_read_splits` (every split read
  and checked before the first record is written) or, to stream large files, `_split_examples`
  (tfds builders are already abstract base classes, so `abc.abstractmethod` keeps this one out of
  the registry of concrete datasets).
  """

  VERSION = tfds.core.Version('1.0.0')
  # No tfds checksum file: raw files are fetched by sources.download. This also
  # skips tfds' lookup of one, which needs the importlib_resources package for
  # builders defined in a package.
  url_infos = None
  # Split names users pass, in the order they are prepared.
  SPLITS: tuple[str, ...] = ()
  # The corpus's two languages, sorted; None: any two, named by the `languages` argument.
  LANGUAGES: tuple[str, str] | None = LANGUAGES

  def __init__(self, *, source_dir: str = '', download_dir: str = '',
               splits: Sequence[str] | None = None, languages: Sequence[str] | None = None,
               **kwargs):
    """Initialises the builder.

    Args:
      source_dir: `config.data.source_dir`; '' means `$SEQ2SEQ_DATA_DIR/<name>`,
        and a download into `download_dir` when that is unset too.
      download_dir: Where downloaded raw files go.
      splits: Prepare only these splits (for sources known to be partial);
        None prepares all of `SPLITS`.
      languages: The two languages of a builder whose LANGUAGES is None.
      **kwargs: Passed to `tfds.core.GeneratorBasedBuilder`.
    """
    self.languages = tuple(sorted(languages)) if self.LANGUAGES is None else self.LANGUAGES
    if len(self.languages) != 2:
      raise ValueError(f'{self.name}: needs two languages, got {languages!r}')
    self._source_dir = source_dir
    self._download_dir = download_dir
    self._splits = tuple(splits or self.SPLITS)
    unknown = sorted(set(self._splits) - set(self.SPLITS))
    if unknown:
      raise ValueError(f'{self.name}: unknown split(s) {unknown}; '
                       f'valid: {", ".join(self.SPLITS)}')
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {field: tfds.features.Text() for field in text_fields(self.languages)}
    features['index'] = tfds.features.Scalar(dtype=np.int32)
    # Records stay in line order: the order is part of the data (`index`), and
    # skipping the shuffle makes preparation faster.
    return _LocalDatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(features),
        description=self.__doc__, disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # Downloads go through sources.download (see _download).
    folder = sources.resolve_source_dir(self._source_dir, self.name)
    if folder is None:
      if not self._download_dir:
        raise sources.MissingSourceError(
            f'{self.name}: no source folder (config.data.source_dir or '
            f'${sources.ENV_VAR}) and no download folder given')
      folder = self._download(Path(self._download_dir) / self.name)
    return self._split_examples(folder)

  def _split_examples(self, folder: Path) -> dict[str, Iterator]:
    """Split -> its (index, example) pairs. Here everything is read and checked before the first
    record is written."""
    columns = self._read_splits(folder, self._splits)
    return {split: self._generate_examples(columns[split])
            for split in self._splits}

  def _generate_examples(self, columns: Columns) -> Iterator:
    names = text_fields(self.languages)
    for index, fields in enumerate(zip(*(columns[f] for f in names))):
      example = dict(zip(names, fields))
      example['index'] = index
      yield index, example

  def _read_splits(self, folder: Path,
                   splits: Sequence[str]) -> dict[str, Columns]:
    """Reads and checks the raw files of `splits` under `folder` (see `_split_examples`).

    Returns:
      For each split, the line-aligned lists of every field of `text_fields`.

    Raises:
      sources.SourceError: Files are missing or unusable.
    """
    raise NotImplementedError(f'{type(self).__name__} reads no whole splits')

  @abc.abstractmethod
  def _download(self, dest: Path) -> Path:
    """Downloads the raw files into `dest` and returns the folder to read."""
