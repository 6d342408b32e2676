"""Validation during training: loss and perplexity over the whole split, and greedy BLEU."""

import math
from typing import Callable

import jax

from data import datasets, pipeline
from data.vocabularies import Vocabularies
from model.transformer import Transformer
from training import partitioning
from evaluation import translating


class Evaluator:
  """Holds the split's padded batches, references and compiled greedy decoder, built once per run."""

  def __init__(self, data: datasets.DataSpec, vocabularies: Vocabularies, model: Transformer, mesh,
               eval_step: Callable):
    """Raises ValueError when config.data.eval_batch_size does not split over the devices."""
    translating.check_batch_size(data.eval_batch_size, 'config.data.eval_batch_size')
    self._mesh = mesh
    self._eval_step = eval_step
    references = datasets.load_split_text(data, data.eval_split).reference
    count = data.eval_examples or len(references)
    self._references = references[:count]
    self._batches = pipeline.make_eval_batches(data, vocabularies, data.eval_split,
                                               data.eval_batch_size, examples=count)
    self._translator = translating.SplitTranslator(model, vocabularies.target, self._batches, mesh)

  def __call__(self, variables, state) -> dict[str, float]:
    """Returns eval_loss (mean NLL per target token), eval_ppl, eval_accuracy and greedy bleu."""
    totals = {'nll': 0.0, 'tokens': 0.0, 'correct': 0.0}
    for batch in self._batches:
      inputs = {name: value for name, value in batch.items() if name != 'example_index'}
      rows = translating.local_rows(inputs, len(batch['encoder_input_tokens']))
      sums = jax.device_get(self._eval_step(state, partitioning.global_batch(rows, self._mesh)))
      for name in totals:
        totals[name] += float(sums[name])
    hypotheses, _ = self._translator(variables)
    loss = totals['nll'] / max(totals['tokens'], 1.0)
    return {'eval_loss': loss, 'eval_ppl': math.exp(min(loss, 100.0)),
            'eval_accuracy': totals['correct'] / max(totals['tokens'], 1.0),
            'bleu': translating.bleu(hypotheses, self._references)}
