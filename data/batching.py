"""Token-budget batching over length buckets, planned one epoch at a time.

Every training pair falls in the bucket of the shortest bucket length L that
holds its longer side (EOS included). All batches of a bucket have the same
shape [B_L, L] for encoder and decoder alike, with B_L = max_tokens // L rounded
down to a multiple of `batch_multiple`, so a train step compiles once per
bucket (8 shapes for max_length 128) and no batch has more than max_tokens
padded tokens on either side, as with fairseq's --max-tokens.

With `pack_length` P, the pairs whose longer side fits P are packed instead:
several pairs share a row of P tokens per side (their sources one after the
other, and their targets), filled first-fit in a seeded order, so a batch
carries far less padding under one compiled shape [max_tokens // P, P]. The
longer pairs keep their buckets above P, one pair per row. Which pairs share a
row is fixed by the seed; the model keeps them apart (segment ids).

An epoch's plan depends only on (seed, epoch): a seeded permutation of the
rows, cut into batches bucket by bucket, in a seeded order. The number of
batches per epoch is the same every epoch. Pure numpy.
"""

import dataclasses

import numpy as np

# Bucket lengths tried, before capping at max_length: multiples of 8 up to
# 32, then powers of two and their midpoints (at most ~33% padding). Finer
# steps (12, 20) raised Multi30k's real share of padded tokens from 74% to 80%
# but, with fewer and larger steps per epoch, left validation loss worse after
# the same tokens on both seeds tried (docs/performance.md), so they are not used.
_BUCKET_LENGTHS = (8, 16, 24, 32) + tuple(
    length for power in range(5, 16) for length in (2**power * 3 // 2,
                                                     2**(power + 1)))


def round_up(value: int, multiple: int) -> int:
  return -(-value // multiple) * multiple


def bucket_lengths(max_length: int) -> np.ndarray:
  """Padded lengths of the buckets, the last one max_length rounded up to 8."""
  longest = round_up(max_length, 8)
  return np.array([n for n in _BUCKET_LENGTHS if n < longest] + [longest])


# Packing fills the first of the most recently opened rows a pair fits in;
# more open rows pack tighter (Multi30k, P = 32: 84% real target tokens with 8,
# 89% with 64) for more work per pair.
_OPEN_ROWS = 64


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """Which pairs form which row, and which rows which batch, for any epoch.

  Attributes:
    lengths: [K] padded length of each bucket (the first is P when packing).
    batch_sizes: [K] rows of every batch of each bucket (the global batch).
    example_ids: [N] ids of the pairs that are batched (the rest is filtered),
      row after row.
    row_starts: [R + 1] row r holds example_ids[row_starts[r]:row_starts[r + 1]].
    row_buckets: [R] bucket of each row.
    pack_length: P, or 0 when every row holds one pair.
    seed: Seed of the data order.
  """
  lengths: np.ndarray
  batch_sizes: np.ndarray
  example_ids: np.ndarray
  row_starts: np.ndarray
  row_buckets: np.ndarray
  pack_length: int
  seed: int

  @property
  def batches_per_epoch(self) -> int:
    counts = np.bincount(self.row_buckets, minlength=len(self.lengths))
    return int(np.sum(-(-counts // self.batch_sizes)))

  def row_pairs(self, row: int) -> np.ndarray:
    """Ids of the pairs in `row`, in the order they sit in it."""
    return self.example_ids[self.row_starts[row]:self.row_starts[row + 1]]

  def epoch_batches(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """Returns the epoch's batches as (bucket, ids of the rows in it)."""
    rng = np.random.default_rng((self.seed, epoch))
    order = rng.permutation(len(self.row_buckets))
    buckets = self.row_buckets[order]
    batches = []
    for bucket, size in enumerate(self.batch_sizes):
      members = order[buckets == bucket]
      batches += [(bucket, members[start:start + size])
                  for start in range(0, len(members), size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def pack(source_lengths: np.ndarray, target_lengths: np.ndarray, length: int,
         rng: np.random.Generator) -> list[list[int]]:
  """Groups pairs into rows whose sources and targets each fit `length` tokens.

  Pairs come in a random order; each goes into the first of the last
  _OPEN_ROWS rows with room for both its sides, else opens a new row.

  Args:
    source_lengths: [N] tokens of each source, EOS included; all <= length.
    target_lengths: [N] tokens of each target, EOS (or BOS) included; all <= length.
    length: P.
    rng: Order of the pairs.

  Returns:
    Rows as lists of indices into the length arrays; every index once.
  """
  rows = []
  open_rows = []  # indices into rows
  free = np.zeros((0, 2), np.int64)  # [open rows, (source, target)] tokens left
  for pair in rng.permutation(len(source_lengths)):
    need = (source_lengths[pair], target_lengths[pair])
    fits = np.flatnonzero((free[:, 0] >= need[0]) & (free[:, 1] >= need[1]))
    if fits.size:
      rows[open_rows[fits[0]]].append(int(pair))
      free[fits[0]] -= need
      continue
    rows.append([int(pair)])
    open_rows.append(len(rows) - 1)
    free = np.concatenate([free, [[length - need[0], length - need[1]]]])
    if len(open_rows) > _OPEN_ROWS:
      open_rows.pop(0)
      free = free[1:]
  return rows


def make_plan(source_lengths: np.ndarray, target_lengths: np.ndarray, *,
              max_length: int, max_tokens: int, batch_multiple: int,
              seed: int, pack_length: int = 0, eligible: np.ndarray | None = None) -> BatchPlan:
  """Plans batches of the pairs that fit in max_length (and are `eligible`).

  Args:
    source_lengths: [N] tokens of each source, EOS included.
    target_lengths: [N] tokens of each target, EOS (or BOS) included.
    max_length: Longest side kept.
    max_tokens: Padded tokens per batch (rows x length), per side.
    batch_multiple: Every batch size is a multiple of this.
    seed: Seed of the data order (and of which pairs share a packed row).
    pack_length: P > 0 packs the pairs whose longer side fits P; 0 does not.
    eligible: [N] bool, the pairs that may be trained on at all (None: every pair).

  Raises:
    ValueError: max_tokens cannot hold `batch_multiple` rows of max_length
      (or of pack_length).
  """
  lengths = bucket_lengths(max_length)
  if pack_length:
    lengths = np.concatenate([[pack_length], lengths[lengths > pack_length]])
  batch_sizes = max_tokens // lengths // batch_multiple * batch_multiple
  if batch_sizes.min() == 0:
    raise ValueError(
        f'max_tokens={max_tokens} cannot hold {batch_multiple} row(s) of the '
        f'longest bucket ({lengths.max()} tokens for max_length={max_length}); '
        f'raise max_tokens to at least {lengths.max() * batch_multiple}')
  longer = np.maximum(source_lengths, target_lengths)
  example_ids = np.flatnonzero((longer <= max_length) & (True if eligible is None else eligible))
  example_buckets = np.searchsorted(lengths, longer[example_ids])
  if not pack_length:  # one row per pair, in id order
    return BatchPlan(lengths, batch_sizes, example_ids,
                     row_starts=np.arange(len(example_ids) + 1),
                     row_buckets=example_buckets, pack_length=0, seed=seed)
  packable = example_ids[example_buckets == 0]
  # A stream of its own, apart from the epochs' (seed, epoch) streams.
  packing_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
  rows = [packable[row] for row in pack(source_lengths[packable], target_lengths[packable],
                                        pack_length, packing_rng)]
  rows += [[pair] for pair in example_ids[example_buckets > 0]]
  return BatchPlan(
      lengths, batch_sizes,
      example_ids=np.concatenate(rows).astype(np.int64),
      row_starts=np.cumsum([0] + [len(row) for row in rows]),
      row_buckets=np.concatenate([np.zeros(len(rows) - np.sum(example_buckets > 0), np.int64),
                                  example_buckets[example_buckets > 0]]),
      pack_length=pack_length, seed=seed)
