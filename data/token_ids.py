"""Token ids of whole splits, computed once per vocabulary and cached on disk.

Tokenizing is done here once per split, so the per-batch work of the pipeline
is numpy indexing only. The cache lives at
`<cache_dir>/token_ids/<dataset>-<dataset_config>-<source fingerprint>-<vocabularies
fingerprint>/<split>.npz`, so neither edited raw files nor a retrained vocabulary meets stale ids.
Sampled segmentations (data.subword_samples) are cached beside them, named by their settings.
"""

import dataclasses
import os
from pathlib import Path
import tempfile
from typing import Callable

import numpy as np

from data import datasets
from data import vocabularies as vocabularies_lib


@dataclasses.dataclass(frozen=True)
class RaggedIds:
  """Variable-length sequences stored flat: sequence i is ids[offsets[i]:offsets[i + 1]]."""
  ids: np.ndarray  # [total] int32
  offsets: np.ndarray  # [N + 1] int64

  @classmethod
  def from_lists(cls, sequences: list[list[int]]) -> 'RaggedIds':
    offsets = np.zeros(len(sequences) + 1, np.int64)
    np.cumsum([len(s) for s in sequences], out=offsets[1:])
    ids = np.fromiter((i for s in sequences for i in s), np.int32,
                      count=offsets[-1])
    return cls(ids, offsets)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  @property
  def lengths(self) -> np.ndarray:
    """[N] tokens of each sequence."""
    return np.diff(self.offsets)


def load(data: datasets.DataSpec, vocabularies: vocabularies_lib.Vocabularies,
         split: str) -> dict[str, RaggedIds]:
  """Returns language -> token ids (no EOS) of every example of `split`, in source order, each
  language in its own vocabulary."""
  datasets.check_split(data.dataset, split)

  def encode():
    examples = datasets.load_examples(data, split)
    return {lang: RaggedIds.from_lists(vocabularies.by_language[lang].encode_batch(examples[lang]))
            for lang in data.corpus_languages}

  return _cached(data.token_ids_dir(vocabularies.fingerprint) / f'{split}.npz', encode,
                 data.corpus_languages)


def load_sampled(data: datasets.DataSpec, vocabularies: vocabularies_lib.Vocabularies,
                 split: str) -> dict[str, RaggedIds]:
  """Language -> `data.subword_samples` sampled segmentations of every example of `split`.

  Copy k (from 0) holds example i at index k * N + i, N the split's examples; copy k of language
  number l is drawn with seed 2k + l + 1, so the copies differ from each other and are the same
  on every machine and in every run.
  """
  datasets.check_split(data.dataset, split)
  samples, alpha, nbest = data.subword_samples, data.subword_alpha, data.subword_nbest

  def encode():
    examples = datasets.load_examples(data, split)
    return {lang: RaggedIds.from_lists([
        ids for copy in range(samples)
        for ids in vocabularies.by_language[lang].sample_batch(
            examples[lang], alpha=alpha, nbest_size=nbest, seed=2 * copy + number + 1)])
            for number, lang in enumerate(data.corpus_languages)}

  name = f'{split}-sampled-{samples}x-alpha{alpha:g}-nbest{nbest}.npz'
  return _cached(data.token_ids_dir(vocabularies.fingerprint) / name, encode,
                 data.corpus_languages)


def _cached(path: Path, encode: Callable[[], dict[str, RaggedIds]],
            languages: tuple[str, str]) -> dict[str, RaggedIds]:
  """The ids stored at `path`, computed by `encode` and stored there first if absent."""
  if not path.exists():
    arrays = {}
    for lang, ragged in encode().items():
      arrays[f'{lang}_ids'], arrays[f'{lang}_offsets'] = ragged.ids, ragged.offsets
    path.parent.mkdir(parents=True, exist_ok=True)
    # Renamed into place once complete: concurrent processes may write it too.
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix='.tmp',
                                     delete=False) as f:
      np.savez(f, **arrays)
    os.replace(f.name, path)
  with np.load(path) as arrays:
    return {lang: RaggedIds(arrays[f'{lang}_ids'], arrays[f'{lang}_offsets'])
            for lang in languages}
