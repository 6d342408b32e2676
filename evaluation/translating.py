"""Translating a split and scoring it: the one path in-training validation and eval.py share.

`SplitTranslator` decodes a split's length-grouped batches with a compiled executable per batch
shape (compiled on first use, timed apart from decoding, reused by every later call, such as each
validation of a run, and by a later run's translator in the same process). Every device searches its
own rows of a batch, independently of the others (`partitioning.per_device_rows`); on several hosts
each process feeds its own rows and the hypotheses are gathered on every process. `score` computes
every sacrebleu score of eval.py's report.
"""

import functools
import time

import jax
import numpy as np
import sacrebleu
import sacremoses
from jax.experimental import multihost_utils

from data import datasets
from data.tokenizer import Tokenizer
from model.translate import translate
from model.transformer import Transformer
from training import partitioning

# Upper ends of the source-length buckets in words; longer sources form the last bucket.
BUCKET_ENDS = (10, 20, 30, 40)
# Whether the dataset's tokenized references went through Moses' normalize-punctuation.perl:
# Multi30k's lc.norm.tok files did; fairseq's prepare-iwslt14.sh and data/parallel_text.py's
# references are tokenized without it.
_REFERENCES_NORMALISED = {'multi30k': True, 'iwslt14': False, 'parallel_text': False}


def check_batch_size(batch_size: int, name: str) -> None:
  """Raises ValueError unless `batch_size` (named `name` in the message) splits over all devices."""
  if batch_size % jax.device_count():
    raise ValueError(f'{name}={batch_size} must be a multiple of the {jax.device_count()} devices')


def local_rows(batch: dict, rows_of_all_processes: int) -> dict:
  """This process's share of the rows of a batch every process built identically."""
  rows = rows_of_all_processes // jax.process_count()
  start = jax.process_index() * rows
  return {name: value[start:start + rows] for name, value in batch.items()}


def hypothesis_text(tokenizer: Tokenizer, ids) -> str:
  """Detokenised text of one hypothesis, on one line: byte-fallback pieces can decode to line
  breaks, which would misalign a file of one hypothesis per line."""
  return ' '.join(tokenizer.decode(ids).splitlines())


def search_per_device(search, model: Transformer, settings: dict, mesh):
  """`search` (`translate` or `beam_translate`) of `model` under `settings`, every device on its own
  rows (`partitioning.per_device_rows`): a jitted `fn(variables, tokens, length_penalty)`. The
  length penalty stays a traced argument, so comparing penalties compiles once. Equal arguments
  give the same function within a process, so a later validation or run finds it traced."""
  static_settings = tuple(sorted((name, value) for name, value in settings.items()
                                 if name != 'length_penalty'))
  return _search_per_device(search, model, static_settings, mesh)


@functools.lru_cache(maxsize=8)
def _search_per_device(search, model: Transformer, static_settings: tuple, mesh):
  return partitioning.per_device_rows(
      lambda variables, tokens, length_penalty: search(
          model, variables, tokens, length_penalty=length_penalty, **dict(static_settings)), mesh)


class SplitTranslator:
  """Best hypotheses of a fixed list of batches, detokenised, in example order."""

  def __init__(self, model: Transformer, target_tokenizer: Tokenizer, batches: list[dict], mesh,
               **settings):
    """Args: the target language's tokenizer, which decodes the hypotheses; batches from
    pipeline.make_eval_batches (every process the same); settings are
    `model.translate.translate`'s keyword arguments (beam_size, length_penalty, ...)."""
    self._target_tokenizer, self._batches, self._mesh = target_tokenizer, batches, mesh
    self._length_penalty = settings.get('length_penalty', 1.0)
    self._search = search_per_device(translate, model, settings, mesh)
    self._executables = {}
    self.num_examples = sum(int((batch['example_index'] >= 0).sum()) for batch in batches)

  def __call__(self, variables) -> tuple[list[str], dict]:
    """Hypotheses in example order, and {'compile_s', 'decode_s', 'sentences_per_sec'}.

    Args:
      variables: the model's variables, replicated on the mesh.
    """
    inputs = [partitioning.global_batch(
        local_rows({'tokens': batch['encoder_input_tokens']}, len(batch['encoder_input_tokens'])),
        self._mesh)['tokens'] for batch in self._batches]
    start = time.perf_counter()
    for tokens in inputs:
      if tokens.shape not in self._executables:
        self._executables[tokens.shape] = self._search.lower(
            variables, tokens, self._length_penalty).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    outputs = [self._executables[tokens.shape](variables, tokens, self._length_penalty)
               for tokens in inputs]
    outputs = [np.asarray(multihost_utils.process_allgather(output, tiled=True))
               for output in outputs]  # waits for the devices
    decode_s = time.perf_counter() - start
    hypotheses = [''] * self.num_examples
    for batch, tokens in zip(self._batches, outputs):
      for index, ids in zip(batch['example_index'], tokens):
        if index >= 0:
          hypotheses[index] = hypothesis_text(self._target_tokenizer, ids)
    return hypotheses, {'compile_s': compile_s, 'decode_s': decode_s,
                        'sentences_per_sec': len(hypotheses) / max(decode_s, 1e-9)}


def bleu(hypotheses: list[str], references: list[str]) -> float:
  """Detokenised, cased corpus BLEU (sacrebleu's defaults, as in eval.py's report)."""
  return sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score


def tokenize_like_references(lines: list[str], data: datasets.DataSpec) -> list[str]:
  """Hypotheses in the form of SplitText.reference_tokenized, for tokenized BLEU."""
  if data.dataset_config == 'tokenized':
    # The model was trained on, and so writes, the tokenized text itself.
    return list(lines)
  normaliser = sacremoses.MosesPunctNormalizer(lang=data.target_lang)
  tokenizer = sacremoses.MosesTokenizer(lang=data.target_lang)
  normalise = _REFERENCES_NORMALISED[data.dataset]
  # escape=True as tokenizer.perl's default, which wrote both datasets' references ("&apos;s").
  return [tokenizer.tokenize(normaliser.normalize(line) if normalise else line, escape=True,
                             return_str=True).lower() for line in lines]


def bucket_names(ends=BUCKET_ENDS) -> list[str]:
  """Names of the source-length buckets with upper ends `ends`: '1-10', '11-20', ..., '41+'."""
  starts = (1,) + tuple(end + 1 for end in ends)
  return [f'{start}-{end}' for start, end in zip(starts, ends)] + [f'{starts[-1]}+']


def source_buckets(sources: list[str], ends=BUCKET_ENDS) -> np.ndarray:
  """[N] bucket of each source by its whitespace-separated words: i where ends[i-1] < words <= ends[i]."""
  return np.searchsorted(ends, [len(source.split()) for source in sources])


def length_buckets(sources: list[str], hypotheses: list[str], references: list[str]) -> list[dict]:
  """Count and detokenised BLEU (None when empty) of each source-length bucket, in words."""
  bucket_of = source_buckets(sources)
  buckets = []
  for i, name in enumerate(bucket_names()):
    members = np.flatnonzero(bucket_of == i)
    hyps, refs = [hypotheses[j] for j in members], [references[j] for j in members]
    buckets.append({'source_words': name, 'count': len(hyps), 'bleu': bleu(hyps, refs) if hyps else None})
  return buckets


def score(hypotheses: list[str], text: datasets.SplitText, data: datasets.DataSpec) -> dict:
  """Every score of the JSON report, computed by sacrebleu."""
  # force=True: tokenized BLEU scores tokenized text on purpose, which sacrebleu would otherwise
  # warn about on the terminal ("forgot to detokenize"); the signature is the same.
  detokenised_bleu, chrf, tokenized_bleu = (sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF(),
                                            sacrebleu.metrics.BLEU(tokenize='none', force=True))
  return {
      'bleu': detokenised_bleu.corpus_score(hypotheses, [text.reference]).score,
      'bleu_signature': str(detokenised_bleu.get_signature()),
      'chrf': chrf.corpus_score(hypotheses, [text.reference]).score,
      'chrf_signature': str(chrf.get_signature()),
      'tokenized_bleu': tokenized_bleu.corpus_score(
          tokenize_like_references(hypotheses, data), [text.reference_tokenized]).score,
      'tokenized_bleu_signature': str(tokenized_bleu.get_signature()),
      'buckets': length_buckets(text.source, hypotheses, text.reference),
  }
