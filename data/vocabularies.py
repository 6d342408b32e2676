"""Which sentencepiece vocabulary encodes each language: one joint vocabulary, or one per language.

`config.data.vocabulary` names the choice:
  'joint'     one model trained on both languages' training text (the default). With
              `model.share_embeddings` one embedding table then serves source and target.
  'separate'  one model per language, trained on that language's side only, each of
              `data.vocab_size` pieces; source and target need their own embedding tables
              (`model.share_embeddings=False`). Per-language models do not depend on the direction,
              so De->En and En->De runs share them in the cache.
"""

import dataclasses
import hashlib
import os

from data import datasets
from data import tokenizer as tokenizer_lib

VOCABULARIES = ('joint', 'separate')


@dataclasses.dataclass(frozen=True)
class Vocabularies:
  """The tokenizer of each language of a run; a joint vocabulary is one object under both codes."""
  by_language: dict[str, tokenizer_lib.Tokenizer]
  source_lang: str
  target_lang: str

  @property
  def source(self) -> tokenizer_lib.Tokenizer:
    return self.by_language[self.source_lang]

  @property
  def target(self) -> tokenizer_lib.Tokenizer:
    return self.by_language[self.target_lang]

  @property
  def joint(self) -> bool:
    return self.source is self.target

  @property
  def fingerprint(self) -> str:
    """Identifies the vocabularies in caches of token ids; a joint one's is its tokenizer's."""
    if self.joint:
      return self.source.fingerprint
    named = ' '.join(f'{lang}:{self.by_language[lang].fingerprint}' for lang in sorted(self.by_language))
    return hashlib.sha256(named.encode()).hexdigest()[:16]

  def describe(self) -> str:
    """'vocabulary 8,000' or 'vocabularies de 8,000 and en 8,000' (source first), for the console."""
    if self.joint:
      return f'vocabulary {self.source.vocab_size:,}'
    return (f'vocabularies {self.source_lang} {self.source.vocab_size:,} and '
            f'{self.target_lang} {self.target.vocab_size:,}')


def check_vocabulary(data_config) -> None:
  """Raises ValueError unless `data_config.vocabulary` is a valid name."""
  if data_config.vocabulary not in VOCABULARIES:
    raise ValueError(f'config.data.vocabulary={data_config.vocabulary!r} is not one of: '
                     f'{", ".join(VOCABULARIES)}')


def get_vocabularies(data: datasets.DataSpec) -> Vocabularies:
  """The cached vocabularies of `data`, each trained first if absent and loaded once."""
  models = data.model_languages
  loaded = {model_language: tokenizer_lib.get_tokenizer(data, model_language)
            for model_language in set(models.values())}
  return Vocabularies({lang: loaded[model_language] for lang, model_language in models.items()},
                      data.source_lang, data.target_lang)


def load(paths: dict[str, str | os.PathLike], data: datasets.DataSpec) -> Vocabularies:
  """Vocabularies from language -> sentencepiece model file; one file named twice loads once."""
  loaded = {}
  for path in paths.values():
    if str(path) not in loaded:
      loaded[str(path)] = tokenizer_lib.Tokenizer(path)
  return Vocabularies({lang: loaded[str(path)] for lang, path in paths.items()}, data.source_lang,
                      data.target_lang)
