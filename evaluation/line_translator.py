"""Translating lines of text with a restored model, for eval.py --input and scripts/translate.py.

The search is built once per translator; each batch shape (sources padded to a multiple of 16
tokens) compiles on first use and is reused by every later line of that length, so a process
that keeps a translator translates line after line without reloading or recompiling.
"""

import numpy as np
from jax.experimental import multihost_utils

from data import batching, pipeline, token_ids
from evaluation import trained_model, translating
from model import decoding
from model.translate import beam_translate
from training import partitioning

# A line's hypotheses: (score, detokenised translation), best first.
Hypotheses = list[tuple[float, str]]


class LineTranslator:
  """The `nbest` best translations of lines, batched by length, returned in input order."""

  def __init__(self, run: trained_model.Restored, settings: dict, batch_size: int, nbest: int,
               mesh):
    """Raises ValueError when `nbest` exceeds the beam size."""
    if nbest > settings['beam_size']:
      raise ValueError(f'--nbest={nbest} exceeds the beam size {settings["beam_size"]}: a beam '
                       f'search keeps that many hypotheses; raise --beam_size')
    self._run, self._settings, self._batch_size, self._nbest = run, settings, batch_size, nbest
    self._mesh = mesh
    self._variables = partitioning.replicate(run.variables, mesh)
    self._search = translating.search_per_device(beam_translate, run.model, settings, mesh)

  def check_length(self, line_ids: list[int], number: int) -> None:
    """Raises ValueError for line `number` when it is longer than the model's positions allow."""
    max_position = self._run.config.model.max_position
    padded = batching.round_up(len(line_ids) + 1, 8)
    generated = decoding.decode_length_limit(padded, self._settings['max_length_a'],
                                             self._settings['max_length_b'])
    if max(padded, generated) > max_position:
      raise ValueError(f'--input line {number} has {len(line_ids)} subword tokens: with its EOS and '
                       f'up to {generated} generated tokens it exceeds the model\'s max_position '
                       f'{max_position}; split the line')

  def __call__(self, lines: list[str], first_number: int = 1) -> list[Hypotheses]:
    """Hypotheses of every line (lines numbered from `first_number` in messages). An empty line
    is not translated: it gets `nbest` empty translations of score 0. Raises ValueError, before
    decoding anything, for a line longer than the model's positions allow."""
    ids = self._run.vocabularies.source.encode_batch(lines)
    for number, line_ids in enumerate(ids, start=first_number):
      self.check_length(line_ids, number)
    translated = [row for row, line_ids in enumerate(ids) if line_ids]  # the non-empty lines
    source = token_ids.RaggedIds.from_lists([ids[row] for row in translated])
    results = [[(0.0, '')] * self._nbest for _ in lines]
    for batch in pipeline.make_source_batches(source, self._batch_size):
      rows = translating.local_rows(batch, len(batch['encoder_input_tokens']))
      tokens = partitioning.global_batch(rows, self._mesh)['encoder_input_tokens']
      hypotheses, scores = self._search(self._variables, tokens,
                                        self._settings['length_penalty'])  # [B, K, T], [B, K]
      hypotheses, scores = (np.asarray(multihost_utils.process_allgather(array, tiled=True))
                            for array in (hypotheses, scores))
      for i, index in enumerate(batch['example_index']):
        if index >= 0:
          results[translated[index]] = [
              (float(scores[i, k]),
               translating.hypothesis_text(self._run.vocabularies.target, hypotheses[i, k]))
              for k in range(self._nbest)]
    return results


def write_translations(results: list[Hypotheses], nbest: int, stream, first_number: int = 1) -> None:
  """One translation per line, or with nbest > 1 `nbest` rows `LINE<TAB>SCORE<TAB>TRANSLATION` per
  line (LINE counting from `first_number`)."""
  for number, hypotheses in enumerate(results, start=first_number):
    if nbest == 1:
      stream.write(hypotheses[0][1] + '\n')
    else:
      for score, text in hypotheses:
        stream.write(f'{number}\t{score:.4f}\t{text}\n')
