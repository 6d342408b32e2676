"""A sentencepiece vocabulary of a dataset: joint over both languages, or of one language.

The model is trained on the training split of both languages (or of the one language) once per
(dataset, dataset_config, raw files, vocab_type, vocab_size, language) and cached as
`<cache_dir>/tokenizers/<dataset>-<dataset_config>-<source fingerprint>-<vocab_type>-<vocab_size>.model`,
`...-<vocab_size>-<language>.model` for one language's. Which languages share one is
data/vocabularies.py's choice.
Options are chosen so that `decode(encode(text)) == text`: no normalisation,
whitespace kept as is, and byte fallback instead of an unknown token.
"""

import hashlib
import io
import os
from pathlib import Path
import re
import tempfile
from typing import Sequence

from absl import logging
from etils import epath
import numpy as np
import sentencepiece as spm

from data import datasets
from model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

VOCAB_TYPES = ('unigram', 'bpe')
# More sentences than this are sampled down; both datasets stay below it.
_MAX_TRAINING_SENTENCES = 2_000_000


class Tokenizer:
  """Text <-> token ids with a sentencepiece model and the fixed special ids."""

  def __init__(self, model_path: str | os.PathLike):
    # A run folder's copy may be on object storage (training/run_dir.py).
    self.model_path = epath.Path(model_path)
    model = self.model_path.read_bytes()
    self._processor = spm.SentencePieceProcessor(model_proto=model)
    # Identifies the vocabulary in caches of token ids.
    self.fingerprint = hashlib.sha256(model).hexdigest()[:16]

  @property
  def vocab_size(self) -> int:
    return self._processor.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Returns the token ids of `text`, without BOS or EOS."""
    return self._processor.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` over many texts, on all cores."""
    return self._processor.encode(list(texts), out_type=int,
                                  num_threads=os.cpu_count())

  def sample_batch(self, texts: Sequence[str], *, alpha: float, nbest_size: int,
                   seed: int) -> list[list[int]]:
    """One sampled segmentation of every text (subword regularization, Kudo 2018), no BOS/EOS.

    Unigram models draw among the `nbest_size` best segmentations (-1: all) with probabilities
    sharpened by `alpha`; BPE models drop merges with probability `alpha` (BPE-dropout). Every
    sample decodes to its text. The same `seed` gives the same samples: sentencepiece's generator
    is seeded and the texts are encoded on one thread, in order.
    """
    spm.set_random_generator_seed(seed)
    return self._processor.encode(list(texts), out_type=int, enable_sampling=True, alpha=alpha,
                                  nbest_size=nbest_size, num_threads=1)

  def pieces(self, ids: Sequence[int] | np.ndarray) -> list[str]:
    """The subword of every id (special ids included, e.g. '</s>'), for labels."""
    return [self._processor.id_to_piece(int(i)) for i in ids]

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Returns the text of `ids`, up to the first EOS, ignoring PAD and BOS."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    return self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])


def get_tokenizer(data: datasets.DataSpec, language: str | None = None) -> Tokenizer:
  """Loads the cached tokenizer of `data`, training it first if absent.

  Args:
    data: the run's DataSpec (dataset, vocab_type, vocab_size, ...).
    language: None for the vocabulary joint over both languages; a language code (one of
      data.languages) for that language's own, trained on its side of the training split only.
  """
  if data.vocab_type not in VOCAB_TYPES:
    raise ValueError(f'Unknown vocab_type {data.vocab_type!r}; valid: {", ".join(VOCAB_TYPES)}')
  if language is not None and language not in data.languages:
    raise ValueError(f'No tokenizer of language {language!r}; valid: {", ".join(data.languages)}')
  path = data.tokenizer_file(language)
  if not path.exists():
    examples = datasets.load_examples(data, 'train')
    sentences = [line for lang in ((language,) if language else data.corpus_languages)
                 for line in examples[lang]]
    logging.info('Training a %d-piece %s sentencepiece model on %d sentences (%s)',
                 data.vocab_size, data.vocab_type, len(sentences), language or 'both languages')
    _train(sentences, path, data.vocab_type, data.vocab_size)
  return Tokenizer(path)


def _train(sentences: list[str], path: Path, vocab_type: str,
           vocab_size: int) -> None:
  """Trains the model into `path`; raises ValueError (one line) naming config.data.vocab_size when
  the training text cannot give `vocab_size` pieces."""
  model = io.BytesIO()
  try:
    _train_into(model, sentences, vocab_type, vocab_size)
  except RuntimeError as error:
    raise ValueError(_vocab_size_error(str(error), vocab_type, vocab_size)) from None
  path.parent.mkdir(parents=True, exist_ok=True)
  # Written under a temporary name and renamed, so that concurrent runs never
  # read a half-written model.
  with tempfile.NamedTemporaryFile(dir=path.parent, suffix='.tmp',
                                   delete=False) as f:
    f.write(model.getvalue())
  os.replace(f.name, path)


def _vocab_size_error(message: str, vocab_type: str, vocab_size: int) -> str:
  """sentencepiece's error of an impossible vocabulary size, as the config field and its bound."""
  too_small = re.search(r'smaller than required_chars\. \d+ vs (\d+)', message)
  if too_small:
    return (f'config.data.vocab_size={vocab_size} is too small for this data: its characters, '
            f'the 256 byte pieces and the special tokens need at least {too_small.group(1)}')
  too_large = re.search(r'Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)',
                        message)
  if too_large:
    return (f'config.data.vocab_size={vocab_size} is more than the training text gives: '
            f'{vocab_type!r} finds at most {too_large.group(1)} pieces in it')
  return f'config.data.vocab_size={vocab_size}: sentencepiece failed: {message.splitlines()[-1]}'


def _train_into(model: io.BytesIO, sentences: list[str], vocab_type: str, vocab_size: int) -> None:
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      model_type=vocab_type,
      vocab_size=vocab_size,
      character_coverage=1.0,
      byte_fallback=True,
      normalization_rule_name='identity',
      remove_extra_whitespaces=False,
      input_sentence_size=_MAX_TRAINING_SENTENCES,
      shuffle_input_sentence=True,
      # Sentences longer than the 4192-byte default would be skipped silently.
      max_sentence_length=1 << 16,
      num_threads=os.cpu_count(),
      pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
      minloglevel=2,
  )
