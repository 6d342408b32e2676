"""Validation during training: loss and perplexity over the whole split, and greedy BLEU."""

import math
from typing import Callable

import jax
import numpy as np
import sacrebleu
from jax.experimental import multihost_utils

from data import datasets, pipeline
from data.tokenizer import Tokenizer
from model.translate import translate
from training import partitioning


class Evaluator:
  """Holds the split's padded batches and references, built once per run."""

  def __init__(self, config, tokenizer: Tokenizer, mesh, eval_step: Callable):
    self._tokenizer = tokenizer
    self._mesh = mesh
    self._eval_step = eval_step
    split = config.data.eval_split
    references = datasets.load_split_text(config.data, split).reference
    count = config.data.eval_examples or len(references)
    self._references = references[:count]
    self._batches = pipeline.make_eval_batches(config.data, tokenizer, split,
                                               config.data.eval_batch_size, examples=count)

  def _local_rows(self, batch: dict) -> dict:
    """This process's share of the rows of a batch every process built identically."""
    rows = len(batch['encoder_input_tokens']) // jax.process_count()
    start = jax.process_index() * rows
    return {name: value[start:start + rows] for name, value in batch.items()}

  def __call__(self, model, variables, state) -> dict[str, float]:
    """Returns eval_loss (mean NLL per target token), eval_ppl, eval_accuracy and greedy bleu."""
    totals = {'nll': 0.0, 'tokens': 0.0, 'correct': 0.0}
    hypotheses = [''] * len(self._references)
    for batch in self._batches:
      inputs = {name: value for name, value in batch.items() if name != 'example_index'}
      sharded = partitioning.global_batch(self._local_rows(inputs), self._mesh)
      sums = jax.device_get(self._eval_step(state, sharded))
      for name in totals:
        totals[name] += float(sums[name])
      tokens = multihost_utils.process_allgather(
          translate(model, variables, sharded['encoder_input_tokens']), tiled=True)
      for index, ids in zip(batch['example_index'], np.asarray(tokens)):
        if index >= 0:
          hypotheses[index] = self._tokenizer.decode(ids)
    loss = totals['nll'] / max(totals['tokens'], 1.0)
    bleu = sacrebleu.corpus_bleu(hypotheses, [self._references])
    return {'eval_loss': loss, 'eval_ppl': math.exp(min(loss, 100.0)),
            'eval_accuracy': totals['correct'] / max(totals['tokens'], 1.0), 'bleu': bleu.score}
