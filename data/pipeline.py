"""Training and evaluation batches (grain), from pre-tokenized splits.

B: batch rows (of this process), S: source length, T: target length.

Every batch is a dict of numpy arrays:
  encoder_input_tokens    [B, S] int32    source + EOS, 0-padded
  decoder_input_tokens    [B, T] int32    BOS + target (the one right shift)
  decoder_target_tokens   [B, T] int32    target + EOS
  decoder_target_weights  [B, T] float32  1 on target tokens and EOS, 0 on pad
  example_index           [B]    int32    line of the pair in its split, -1 on
                                          padding rows (all-zero tokens)
and training batches also carry `epoch` ([] int32, the epoch the batch belongs
to). `example_index` and `epoch` are bookkeeping for the host, not model inputs.

With data.pack_length a training row holds several pairs one after the other
(batching.pack), and its batches instead of `example_index` carry
  encoder_segment_ids     [B, S] int32    pair 1, 2, ... of the row; 0 on pad
  decoder_segment_ids     [B, T] int32    the same for the target side
  encoder_positions       [B, S] int32    0, 1, ... within each pair
  decoder_positions       [B, T] int32
(model/transformer.py keeps the pairs apart with them).

With data.subword_samples K the training set is K copies of every pair, each
with its own sampled segmentation (token_ids.load_sampled), planned and
shuffled as one set of K x N pairs: an epoch trains on every sentence K times,
each time cut differently, and `example_index` k * N + i is line i's copy k.

Multi-host: data.max_tokens budgets the global batch. Every process
computes the same plan of global batches (batching.BatchPlan, from the seed
alone) and assembles only its contiguous block of rows of each batch, so all
processes yield the same number of batches of the same shapes, their rows are
disjoint and together cover the data, and the data order does not depend on
the number of processes.
"""

import functools
from typing import Iterator

from absl import logging
import grain
import numpy as np

from data import batching
from data import datasets
from data import token_ids
from data import tokenizer as tokenizer_lib
from data import vocabularies as vocabularies_lib

# Evaluation batches pad both sides to a multiple of this. Each padded length is one more search
# to compile (or, from the compilation cache, to trace: ~0.45 s each on the 2-core Xeon VM);
# against multiples of 8, 16 halves the shapes of Multi30k's test_2016 (4 to 2) for ~5% more
# decoding, with the same hypotheses (docs/performance.md).
EVAL_LENGTH_MULTIPLE = 16


class TrainIterator(Iterator[dict]):
  """Endless training batches, epoch after epoch, resumable.

  Attributes:
    num_pairs: Training pairs batched (every epoch; each sampled copy counts, data.subword_samples).
    num_filtered: Training pairs dropped for exceeding max_length (copies likewise).
    num_long_sources: Training pairs dropped for a source of more than train_max_source_words
      words (counted apart from num_filtered).
    batches_per_epoch: Batches (steps) in every epoch.
    batch_shapes: Every [B, L] shape this process's batches can have.
    shape_batches: Batches of each of batch_shapes in every epoch.
  """

  def __init__(self, iterator: grain.DatasetIterator, plan: batching.BatchPlan,
               num_filtered: int, process_count: int, num_long_sources: int = 0):
    self._iterator = iterator
    self.num_pairs = len(plan.example_ids)
    self.num_filtered = num_filtered
    self.num_long_sources = num_long_sources
    self.batches_per_epoch = plan.batches_per_epoch
    self.batch_shapes = [(int(size) // process_count, int(length))
                         for size, length in zip(plan.batch_sizes, plan.lengths)]
    rows = np.bincount(plan.row_buckets, minlength=len(plan.lengths))
    self.shape_batches = [int(count) for count in -(-rows // plan.batch_sizes)]

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  def get_state(self) -> dict:
    """Returns the position, a small JSON-serialisable dict."""
    return self._iterator.get_state()

  def set_state(self, state: dict) -> None:
    """Continues from a position returned by `get_state`."""
    self._iterator.set_state(state)


def make_train_iterator(data: datasets.DataSpec, vocabularies: vocabularies_lib.Vocabularies, *,
                        seed: int, process_index: int = 0,
                        process_count: int = 1,
                        batch_multiple: int = 1) -> TrainIterator:
  """Returns this process's endless iterator over shuffled training batches.

  Args:
    data: the run's DataSpec (max_length, max_tokens, num_workers, ...).
    vocabularies: The vocabulary of each language.
    seed: Seed of the data order; epoch e is shuffled with (seed, e).
    process_index: This process, in [0, process_count).
    process_count: Processes sharing each global batch.
    batch_multiple: Local batch sizes are multiples of it (devices per process).
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} not in [0, {process_count})')
  source, target = _split_ids(data, vocabularies, 'train', sampled=data.subword_samples > 0)
  short_sources = short_source_pairs(data)
  if short_sources is not None and data.subword_samples:
    short_sources = np.tile(short_sources, data.subword_samples)
  # EOS (source, target) and BOS (decoder input) add one token per side.
  plan = batching.make_plan(
      source.lengths + 1, target.lengths + 1,
      max_length=data.max_length, max_tokens=data.max_tokens,
      batch_multiple=batch_multiple * process_count, seed=seed,
      pack_length=data.pack_length, eligible=short_sources)
  num_long_sources = 0 if short_sources is None else int((~short_sources).sum())
  num_filtered = len(source) - len(plan.example_ids) - num_long_sources
  logging.info('Training on %d pairs in %d batches per epoch; %d pairs longer '
               'than max_length=%d tokens and %d with sources of more than %d words are left out',
               len(plan.example_ids), plan.batches_per_epoch, num_filtered, data.max_length,
               num_long_sources, data.train_max_source_words)

  # Prefetching threads may straddle two epochs.
  epoch_batches = functools.lru_cache(maxsize=2)(plan.epoch_batches)

  def make_batch(index: int, _) -> dict[str, np.ndarray]:
    epoch, position = divmod(index, plan.batches_per_epoch)
    bucket, ids = epoch_batches(epoch)[position]
    rows = np.full(plan.batch_sizes[bucket], -1, np.int64)
    rows[:len(ids)] = ids
    local = len(rows) // process_count
    rows = rows[process_index * local:(process_index + 1) * local]
    length = plan.lengths[bucket]
    if plan.pack_length:
      batch = assemble_packed(source, target, [plan.row_pairs(row) if row >= 0 else []
                                               for row in rows], length)
    else:
      # One pair per row: row r holds pair example_ids[r].
      pairs = np.where(rows >= 0, plan.example_ids[np.maximum(rows, 0)], -1)
      batch = assemble(source, target, pairs, length, length)
    batch['epoch'] = np.asarray(epoch, np.int32)
    return batch

  dataset = (grain.MapDataset.range(plan.batches_per_epoch).repeat()
             .map_with_index(make_batch))
  read_options = grain.ReadOptions(num_threads=data.num_workers,
                                   prefetch_buffer_size=2 * data.num_workers)
  iterator = iter(dataset.to_iter_dataset(read_options))
  return TrainIterator(iterator, plan, num_filtered, process_count, num_long_sources)


def short_source_pairs(data: datasets.DataSpec) -> np.ndarray | None:
  """[N] bool: training pairs whose source has at most `train_max_source_words` whitespace-separated
  words (the length-extrapolation experiments train on these only); None when there is no limit."""
  if not data.train_max_source_words:
    return None
  words = np.array([len(line.split())
                    for line in datasets.load_examples(data, 'train')[data.source_lang]])
  return words <= data.train_max_source_words


def make_eval_batches(data: datasets.DataSpec, vocabularies: vocabularies_lib.Vocabularies,
                      split: str, batch_size: int,
                      examples: int | None = None) -> list[dict[str, np.ndarray]]:
  """Returns every pair of `split` (or its first `examples`), none dropped or truncated.

  Pairs are grouped by length (source, then target), as fairseq does, so a batch
  carries little padding and a search stops early for short sentences;
  `example_index` gives each row's line in the split. Batches have `batch_size`
  rows (the last one padded) and source and target padded to one length: the
  longest sequence of the batch, either side, rounded up to a multiple of
  EVAL_LENGTH_MULTIPLE. So the shapes to compile are one per multiple, not one
  per pair of lengths.
  """
  source, target = _split_ids(data, vocabularies, split)
  count = len(source) if examples is None else min(examples, len(source))
  batches = []
  for rows in _length_grouped_rows(batch_size, source.lengths[:count],
                                   target.lengths[:count]):
    real = rows[rows >= 0]
    longest = max(source.lengths[real].max(), target.lengths[real].max())
    length = batching.round_up(int(longest) + 1, EVAL_LENGTH_MULTIPLE)
    batches.append(assemble(source, target, rows, length, length))
  return batches


def make_source_batches(source: token_ids.RaggedIds,
                        batch_size: int) -> list[dict[str, np.ndarray]]:
  """Sources alone (text to translate), grouped by length as make_eval_batches.

  Each batch holds `encoder_input_tokens` [batch_size, S] (source + EOS,
  0-padded, S the batch's longest rounded up to EVAL_LENGTH_MULTIPLE) and
  `example_index` [batch_size] (the sequence's index in `source`, -1 on
  padding rows).
  """
  batches = []
  for rows in _length_grouped_rows(batch_size, source.lengths):
    real = rows[rows >= 0]
    length = batching.round_up(int(source.lengths[real].max()) + 1, EVAL_LENGTH_MULTIPLE)
    batches.append({
        'encoder_input_tokens': _pad(source, rows, length, shift=0,
                                     marker=tokenizer_lib.EOS_ID),
        'example_index': rows.astype(np.int32),
    })
  return batches


def _length_grouped_rows(batch_size: int,
                         *lengths: np.ndarray) -> list[np.ndarray]:
  """[batch_size] row ids per batch (-1 fills the last), ordered by lengths[0],
  ties by lengths[1], ..."""
  order = np.lexsort(lengths[::-1])
  batches = []
  for start in range(0, len(order), batch_size):
    rows = np.full(batch_size, -1)
    real = order[start:start + batch_size]
    rows[:len(real)] = real
    batches.append(rows)
  return batches


def assemble(source: token_ids.RaggedIds, target: token_ids.RaggedIds,
             rows: np.ndarray, source_length: int,
             target_length: int) -> dict[str, np.ndarray]:
  """Builds the padded arrays of the pairs `rows` (-1: padding row).

  Args:
    source: Source token ids of the split, no EOS.
    target: Target token ids of the split, no EOS.
    rows: [B] pair ids, -1 for all-padding rows.
    source_length: S, at least the longest source + 1.
    target_length: T, at least the longest target + 1.
  """
  decoder_target = _pad(target, rows, target_length, shift=0,
                        marker=tokenizer_lib.EOS_ID)
  return {
      'encoder_input_tokens': _pad(source, rows, source_length, shift=0,
                                   marker=tokenizer_lib.EOS_ID),
      'decoder_input_tokens': _pad(target, rows, target_length, shift=1,
                                   marker=tokenizer_lib.BOS_ID),
      'decoder_target_tokens': decoder_target,
      'decoder_target_weights': (decoder_target != tokenizer_lib.PAD_ID).astype(
          np.float32),
      'example_index': rows.astype(np.int32),
  }


def assemble_packed(source: token_ids.RaggedIds, target: token_ids.RaggedIds,
                    rows: list[np.ndarray], length: int) -> dict[str, np.ndarray]:
  """Builds the arrays of packed rows: row b holds the pairs rows[b], one after the other.

  Every pair's span on each side is its tokens plus EOS (the decoder input: BOS plus its
  tokens), numbered by segment id 1, 2, ... with positions from 0; the rest is padding.

  Args:
    source: Source token ids of the split, no EOS.
    target: Target token ids of the split, no EOS.
    rows: [B] arrays of pair ids (empty: a padding row).
    length: P, at least every row's sources' (and targets') tokens plus one each.
  """
  counts = np.array([len(row) for row in rows], np.int64)
  pairs = np.concatenate([np.asarray(row, np.int64) for row in rows] + [np.zeros(0, np.int64)])
  pair_rows = np.repeat(np.arange(len(rows)), counts)
  in_row = _within(counts)  # index of each pair within its row
  batch = {}
  for side, ragged in (('encoder', source), ('decoder', target)):
    spans = ragged.offsets[pairs + 1] - ragged.offsets[pairs] + 1  # tokens + EOS (or BOS)
    starts = np.cumsum(spans) - spans
    starts -= np.repeat(starts[in_row == 0], counts[counts > 0])  # from the row's first column
    span_rows, span_columns = np.repeat(pair_rows, spans), np.repeat(starts, spans) + _within(spans)
    for name, values in (('segment_ids', np.repeat(in_row + 1, spans)), ('positions', _within(spans))):
      batch[f'{side}_{name}'] = np.zeros((len(rows), length), np.int32)
      batch[f'{side}_{name}'][span_rows, span_columns] = values
    if side == 'encoder':
      batch['encoder_input_tokens'] = _place(source, pairs, pair_rows, starts, len(rows), length,
                                             shift=0, marker=tokenizer_lib.EOS_ID)
    else:
      batch['decoder_input_tokens'] = _place(target, pairs, pair_rows, starts, len(rows), length,
                                             shift=1, marker=tokenizer_lib.BOS_ID)
      batch['decoder_target_tokens'] = _place(target, pairs, pair_rows, starts, len(rows), length,
                                              shift=0, marker=tokenizer_lib.EOS_ID)
  batch['decoder_target_weights'] = (batch['decoder_target_tokens'] != tokenizer_lib.PAD_ID).astype(
      np.float32)
  return batch


def _within(lengths: np.ndarray) -> np.ndarray:
  """0, 1, ..., n - 1 for every n in `lengths`, concatenated."""
  return np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _place(ragged: token_ids.RaggedIds, pairs: np.ndarray, rows: np.ndarray,
           columns: np.ndarray, num_rows: int, width: int, *, shift: int,
           marker: int) -> np.ndarray:
  """[num_rows, width] ids: pair pairs[i] from column columns[i] of row rows[i], 0 elsewhere.

  Each sequence is shifted right by `shift` (0 or 1) within its span; `marker` goes at
  the span's first column when shift is 1 (BOS), else right after the sequence (EOS).
  """
  out = np.zeros((num_rows, width), np.int32)
  starts = ragged.offsets[pairs]
  lengths = ragged.offsets[pairs + 1] - starts
  within = _within(lengths)
  # One entry per token of the batch: its row, and its column.
  out[np.repeat(rows, lengths), np.repeat(columns, lengths) + within + shift] = ragged.ids[
      np.repeat(starts, lengths) + within]
  out[rows, columns + (0 if shift else lengths)] = marker
  return out


def _pad(ragged: token_ids.RaggedIds, rows: np.ndarray, width: int, *,
         shift: int, marker: int) -> np.ndarray:
  """[B, width] ids of `rows` (-1: a padding row), one sequence per row from column 0."""
  real = np.flatnonzero(rows >= 0)
  return _place(ragged, rows[real], real, np.zeros(len(real), np.int64), len(rows), width,
                shift=shift, marker=marker)


def _split_ids(data: datasets.DataSpec, vocabularies: vocabularies_lib.Vocabularies, split: str,
               sampled: bool = False):
  """Returns the (source, target) token ids of `split` (its sampled copies if `sampled`)."""
  ids = (token_ids.load_sampled if sampled else token_ids.load)(data, vocabularies, split)
  return ids[data.source_lang], ids[data.target_lang]
