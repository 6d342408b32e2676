"""The joint sentencepiece tokenizer: exact round trips, fixed ids, caching."""

import gzip

import pytest

from data import datasets
from data import multi30k
from data import tokenizer as tokenizer_lib
from tests import data_fixtures
from tests.data_fixtures import multi30k_config, multi30k_tokenizer  # pylint: disable=unused-import


@pytest.mark.parametrize('lang', ['de', 'en'])
def test_round_trip_on_the_whole_validation_set(multi30k_config,
                                                multi30k_tokenizer, lang):
  sentences = datasets.load_examples(datasets.resolve(multi30k_config), 'validation')[lang]
  assert len(sentences) == 1014
  ids = multi30k_tokenizer.encode_batch(sentences)
  assert [multi30k_tokenizer.decode(x) for x in ids] == sentences
  assert ids[0] == multi30k_tokenizer.encode(sentences[0])
  assert not any(tokenizer_lib.UNK_ID in x for x in ids)


def _small_unigram(tmp_path) -> tuple:
  """(config, tokenizer) of an 800-piece unigram model on the first 1,500 training pairs.

  Unigram training on all 58,000 training lines takes ~20 s here, so this source has the first
  1,500 training pairs, the real validation split and tiny test splits.
  """
  root = data_fixtures.data_root() / 'multi30k'
  source = data_fixtures.write_multi30k(tmp_path / 'multi30k')
  for split, count in (('train', 1500), ('validation', None)):
    for name in (multi30k.raw_name, multi30k.tok_name):
      for lang in ('de', 'en'):
        lines = data_fixtures.read_gzip_lines(root / f'{name(split, lang)}.gz')
        with gzip.open(source / f'{name(split, lang)}.gz', 'wt',
                       encoding='utf-8') as f:
          f.write(''.join(f'{line}\n' for line in lines[:count]))
  config = data_fixtures.data_config(
      source_dir=str(source), cache_dir=str(tmp_path / 'cache'),
      vocab_type='unigram', vocab_size=800)
  return config, tokenizer_lib.get_tokenizer(datasets.resolve(config))


def test_unigram_round_trip(tmp_path):
  config, tokenizer = _small_unigram(tmp_path)
  assert tokenizer.vocab_size == 800
  for lang in ('de', 'en'):
    sentences = datasets.load_examples(datasets.resolve(config), 'validation')[lang]
    assert len(sentences) == 1014
    assert [tokenizer.decode(tokenizer.encode(s)) for s in sentences] == sentences


@pytest.mark.parametrize('vocab_type', ['unigram', 'bpe'])
def test_sampled_segmentations_decode_to_the_text_and_follow_the_seed(
    tmp_path, multi30k_config, multi30k_tokenizer, vocab_type):
  if vocab_type == 'unigram':
    config, tokenizer = _small_unigram(tmp_path)
  else:  # the test vocabulary: BPE-dropout
    config, tokenizer = multi30k_config, multi30k_tokenizer
  sentences = datasets.load_examples(datasets.resolve(config), 'validation')['de']
  best = tokenizer.encode_batch(sentences)
  sample = tokenizer.sample_batch(sentences, alpha=0.1, nbest_size=64, seed=1)
  assert [tokenizer.decode(ids) for ids in sample] == sentences
  # Most sentences are cut otherwise than by the best segmentation, and by another seed.
  assert sum(s != b for s, b in zip(sample, best)) > 0.5 * len(sentences)
  other_seed = tokenizer.sample_batch(sentences, alpha=0.1, nbest_size=64, seed=2)
  assert sum(s != o for s, o in zip(sample, other_seed)) > 0.5 * len(sentences)
  assert tokenizer.sample_batch(sentences, alpha=0.1, nbest_size=64, seed=1) == sample


def test_special_ids(multi30k_tokenizer):
  assert (tokenizer_lib.PAD_ID, tokenizer_lib.EOS_ID, tokenizer_lib.BOS_ID,
          tokenizer_lib.UNK_ID) == (0, 1, 2, 3)
  assert multi30k_tokenizer.vocab_size == data_fixtures.TEST_VOCAB_SIZE
  ids = multi30k_tokenizer.encode('Ein Hund läuft.')
  assert min(ids) > tokenizer_lib.UNK_ID
  decoded = multi30k_tokenizer.decode(
      [tokenizer_lib.BOS_ID] + ids + [tokenizer_lib.EOS_ID] + ids + [0, 0])
  assert decoded == 'Ein Hund läuft.'
  assert multi30k_tokenizer.decode(ids + [0, 0]) == 'Ein Hund läuft.'


def test_tokenizer_is_cached_by_its_settings(multi30k_config,
                                             multi30k_tokenizer):
  path = datasets.resolve(multi30k_config).tokenizer_file()
  fingerprint = datasets.resolve(multi30k_config).fingerprint
  assert path.name == f'multi30k-original-{fingerprint}-bpe-1000.model'
  assert multi30k_tokenizer.model_path == path
  modified = path.stat().st_mtime_ns
  again = tokenizer_lib.get_tokenizer(datasets.resolve(multi30k_config))
  assert path.stat().st_mtime_ns == modified
  assert again.fingerprint == multi30k_tokenizer.fingerprint
  assert not list(path.parent.glob('*.tmp'))
