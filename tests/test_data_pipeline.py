"""Training and evaluation batches: content, budget, coverage, resumption, shards."""

import collections
import json

import numpy as np
import pytest

from data import datasets
from data import pipeline
from data import token_ids
from data import tokenizer as tokenizer_lib
from tests.data_fixtures import multi30k_config, multi30k_vocabularies  # pylint: disable=unused-import

_KEYS = {'encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
         'decoder_target_weights', 'example_index', 'epoch'}


def _take(iterator, count):
  return [next(iterator) for _ in range(count)]


def _assert_same_batches(first, second):
  assert len(first) == len(second)
  for a, b in zip(first, second):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_batches_hold_the_shifted_pairs(multi30k_config, multi30k_vocabularies):
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=0)
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'train')
  for batch in _take(iterator, 3):
    assert set(batch) == _KEYS
    assert batch['encoder_input_tokens'].dtype == np.int32
    assert batch['decoder_target_weights'].dtype == np.float32
    targets = batch['decoder_target_tokens']
    np.testing.assert_array_equal(batch['decoder_target_weights'], targets != 0)
    for row, index in enumerate(batch['example_index']):
      if index < 0:
        assert not batch['encoder_input_tokens'][row].any()
        assert not batch['decoder_target_weights'][row].any()
        continue
      source = batch['encoder_input_tokens'][row]
      assert multi30k_vocabularies.source.decode(source) == text.source[index]
      assert source[np.count_nonzero(source) - 1] == tokenizer_lib.EOS_ID
      assert multi30k_vocabularies.target.decode(targets[row]) == text.reference[index]
      shifted = np.concatenate([[tokenizer_lib.BOS_ID], targets[row, :-1]])
      shifted[shifted == tokenizer_lib.EOS_ID] = 0
      np.testing.assert_array_equal(batch['decoder_input_tokens'][row], shifted)


def test_an_epoch_covers_every_kept_pair_once_within_budget(multi30k_config,
                                                            multi30k_vocabularies):
  multi30k_config.max_length = 24
  multi30k_config.max_tokens = 2000
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=3, batch_multiple=8)
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'train')
  too_long = {i for i, (source, target) in enumerate(zip(text.source,
                                                         text.reference))
              if max(len(multi30k_vocabularies.source.encode(source)),
                     len(multi30k_vocabularies.target.encode(target))) + 1 > 24}
  assert iterator.num_filtered == len(too_long) > 0
  assert [length for _, length in iterator.batch_shapes] == [8, 16, 24]

  batches = _take(iterator, iterator.batches_per_epoch)
  seen = np.concatenate([b['example_index'] for b in batches])
  seen = seen[seen >= 0]
  assert len(seen) == len(set(seen.tolist())) == 29000 - len(too_long)
  assert not too_long & set(seen.tolist())
  for batch in batches:
    rows, length = batch['encoder_input_tokens'].shape
    assert rows * length <= 2000 and rows % 8 == 0
    assert (rows, length) in iterator.batch_shapes
    assert batch['decoder_target_tokens'].shape == (rows, length)
    assert batch['epoch'] == 0
  counted = collections.Counter(batch['encoder_input_tokens'].shape for batch in batches)
  assert [counted[shape] for shape in iterator.batch_shapes] == iterator.shape_batches
  next_epoch = next(iterator)
  assert next_epoch['epoch'] == 1


def test_packing_at_max_length_puts_every_batch_in_one_shape(multi30k_config, multi30k_vocabularies):
  # What the trainer's notice about several batch shapes advises (training/stepping.py).
  multi30k_config.update(max_length=24, max_tokens=2000, pack_length=24)
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=3, batch_multiple=8)
  shapes = {shape for shape, count in zip(iterator.batch_shapes, iterator.shape_batches) if count}
  assert len(shapes) == 1 and sum(iterator.shape_batches) == iterator.batches_per_epoch
  batches = _take(iterator, iterator.batches_per_epoch)
  assert {batch['encoder_input_tokens'].shape for batch in batches} == shapes


def test_a_source_word_limit_trains_on_the_short_pairs_only_and_counts_the_rest(multi30k_config,
                                                                               multi30k_vocabularies):
  multi30k_config.train_max_source_words = 10
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=0)
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'train')
  long_sources = {i for i, source in enumerate(text.source) if len(source.split()) > 10}
  assert iterator.num_long_sources == len(long_sources) > 0
  batches = _take(iterator, iterator.batches_per_epoch)
  seen = np.concatenate([b['example_index'] for b in batches])
  seen = set(seen[seen >= 0].tolist())
  assert not seen & long_sources
  assert len(seen) == iterator.num_pairs == 29000 - len(long_sources) - iterator.num_filtered


def test_epochs_are_reshuffled_deterministically(multi30k_config,
                                                 multi30k_vocabularies):
  def first_rows(seed, skip_epochs=0):
    iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config),
                                            multi30k_vocabularies,
                                            seed=seed)
    _take(iterator, skip_epochs * iterator.batches_per_epoch)
    return next(iterator)['example_index']

  np.testing.assert_array_equal(first_rows(0), first_rows(0))
  assert not np.array_equal(first_rows(0), first_rows(1))
  assert not np.array_equal(first_rows(0), first_rows(0, skip_epochs=1))


@pytest.mark.parametrize('num_workers', [0, 2])
def test_resuming_from_state_gives_the_same_batches(multi30k_config,
                                                    multi30k_vocabularies,
                                                    num_workers):
  multi30k_config.num_workers = num_workers
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=5)
  # Stop just before an epoch boundary, so resuming crosses it.
  _take(iterator, iterator.batches_per_epoch - 2)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = _take(iterator, 4)
  assert [int(b['epoch']) for b in expected] == [0, 0, 1, 1]

  resumed = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                         seed=5)
  resumed.set_state(state)
  _assert_same_batches(_take(resumed, 4), expected)


def test_process_shards_are_disjoint_and_cover_the_global_batch(
    multi30k_config, multi30k_vocabularies):
  make = lambda **kwargs: pipeline.make_train_iterator(
      datasets.resolve(multi30k_config), multi30k_vocabularies, seed=7, **kwargs)
  single = make(batch_multiple=4)
  shards = [make(process_index=i, process_count=2, batch_multiple=2)
            for i in range(2)]
  assert shards[0].batches_per_epoch == single.batches_per_epoch
  for _ in range(20):
    whole = next(single)
    parts = [next(shard) for shard in shards]
    assert parts[0]['encoder_input_tokens'].shape == (
        parts[1]['encoder_input_tokens'].shape)
    for key in ('encoder_input_tokens', 'decoder_target_tokens',
                'example_index'):
      np.testing.assert_array_equal(
          np.concatenate([p[key] for p in parts]), whole[key])
    assert len(parts[0]['example_index']) % 2 == 0
    real = [set(p['example_index'][p['example_index'] >= 0].tolist())
            for p in parts]
    assert not real[0] & real[1]


def test_too_small_token_budget(multi30k_config, multi30k_vocabularies):
  multi30k_config.max_tokens = 100
  with pytest.raises(ValueError, match='max_tokens=100 cannot hold'):
    pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies, seed=0)


def test_eval_batches_keep_every_pair_grouped_by_length(multi30k_config,
                                                        multi30k_vocabularies):
  batches = pipeline.make_eval_batches(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                       'test_2016', batch_size=64)
  index = np.concatenate([b['example_index'] for b in batches])
  assert len(index) == 16 * 64
  np.testing.assert_array_equal(np.sort(index[:1000]), np.arange(1000))
  assert (index[1000:] == -1).all()
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'test_2016')
  source_lengths = []
  for batch in batches:
    assert set(batch) == _KEYS - {'epoch'}
    length = batch['encoder_input_tokens'].shape[1]
    assert length % pipeline.EVAL_LENGTH_MULTIPLE == 0
    assert batch['decoder_target_tokens'].shape[1] == length
    real_rows = batch['example_index'] >= 0
    assert not batch['decoder_target_weights'][~real_rows].any()
    for row in np.flatnonzero(real_rows)[::16]:
      assert multi30k_vocabularies.source.decode(batch['encoder_input_tokens'][row]) == (
          text.source[batch['example_index'][row]])
    # Nothing was truncated: every sequence ends with EOS inside the batch.
    for key in ('encoder_input_tokens', 'decoder_target_tokens'):
      real = batch[key][real_rows]
      lengths = np.count_nonzero(real, axis=1)
      assert (real[np.arange(len(real)), lengths - 1] == tokenizer_lib.EOS_ID
             ).all()
    source_lengths.append(
        np.count_nonzero(batch['encoder_input_tokens'][real_rows], axis=1))
  # Grouped by source length: the lengths run in order through the batches.
  assert (np.diff(np.concatenate(source_lengths)) >= 0).all()


def test_eval_batches_of_the_first_examples(multi30k_config,
                                            multi30k_vocabularies):
  batches = pipeline.make_eval_batches(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                       'test_2016', batch_size=64, examples=100)
  index = np.concatenate([b['example_index'] for b in batches])
  assert len(batches) == 2
  np.testing.assert_array_equal(np.sort(index[index >= 0]), np.arange(100))


def test_subword_samples_train_on_every_sampled_copy_once_per_epoch(multi30k_config,
                                                                   multi30k_vocabularies):
  multi30k_config.update(subword_samples=2, subword_alpha=0.1, max_length=256)
  iterator = pipeline.make_train_iterator(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                          seed=0)
  assert iterator.num_filtered == 0 and iterator.num_pairs == 2 * 29000
  text = datasets.load_split_text(datasets.resolve(multi30k_config), 'train')
  batches = _take(iterator, iterator.batches_per_epoch)
  seen = np.concatenate([b['example_index'] for b in batches])
  assert sorted(seen[seen >= 0].tolist()) == list(range(2 * 29000))
  best = token_ids.load(datasets.resolve(multi30k_config), multi30k_vocabularies, 'train')['de']
  for batch in batches[:3]:
    for row, index in enumerate(batch['example_index']):
      if index < 0:
        continue
      # Copy index // 29000 of line index % 29000: its text, cut as sampled.
      source = batch['encoder_input_tokens'][row]
      assert multi30k_vocabularies.source.decode(source) == text.source[index % 29000]
      assert multi30k_vocabularies.target.decode(batch['decoder_target_tokens'][row]) == (
          text.reference[index % 29000])
  copies = token_ids.load_sampled(datasets.resolve(multi30k_config), multi30k_vocabularies,
                                  'train')['de']
  assert len(copies) == 2 * 29000
  cut = lambda ragged, i: ragged.ids[ragged.offsets[i]:ragged.offsets[i + 1]].tolist()
  # Both copies differ from the best segmentation, and from each other, on most lines.
  lines = range(0, 29000, 29)
  assert sum(cut(copies, i) != cut(best, i) for i in lines) > 0.5 * len(lines)
  assert sum(cut(copies, 29000 + i) != cut(best, i) for i in lines) > 0.5 * len(lines)
  assert sum(cut(copies, i) != cut(copies, 29000 + i) for i in lines) > 0.5 * len(lines)
