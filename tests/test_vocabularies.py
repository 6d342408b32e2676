"""Joint and separate vocabularies: which tokenizer encodes which language, in batches and caches,
in a run folder, and in eval.py's two ways of reading a source."""

import functools
import json

import numpy as np
import pytest

import eval as eval_lib
from configs import base, smoke
from data import datasets, pipeline, token_ids
from data import tokenizer as tokenizer_lib
from data import vocabularies as vocabularies_lib
from analysis import experiment
from training import config_checks, partitioning, run_dir, trainer
from evaluation.line_translator import LineTranslator
from evaluation import trained_model
from tests import data_fixtures
from tests.data_fixtures import multi30k_config  # pylint: disable=unused-import


@functools.cache
def _vocabularies(cache_dir: str, source_dir: str, vocabulary: str, source_lang: str,
                  target_lang: str) -> vocabularies_lib.Vocabularies:
  return vocabularies_lib.get_vocabularies(
      datasets.resolve(_config(cache_dir, source_dir, vocabulary, source_lang, target_lang)))


def _config(cache_dir, source_dir, vocabulary, source_lang, target_lang):
  """data_fixtures' test vocabulary settings (1,000 BPE pieces) with these fields."""
  return data_fixtures.data_config(cache_dir=cache_dir, source_dir=source_dir, vocabulary=vocabulary,
                                   source_lang=source_lang, target_lang=target_lang)


def config_and_vocabularies(multi30k_config, vocabulary, source_lang='en', target_lang='de'):
  """Real Multi30k En->De (by default) with `vocabulary`, and its vocabularies (trained once)."""
  key = (multi30k_config.cache_dir, multi30k_config.source_dir, vocabulary, source_lang, target_lang)
  return _config(*key), _vocabularies(*key)


def mean_tokens(tokenizer, lines):
  return np.mean([len(ids) for ids in tokenizer.encode_batch(lines)])


def test_separate_vocabularies_are_one_per_language_each_fitted_to_its_own(multi30k_config):
  config, separate = config_and_vocabularies(multi30k_config, 'separate')
  assert not separate.joint
  assert separate.source is separate.by_language['en'] and separate.target is separate.by_language['de']
  assert separate.source.vocab_size == separate.target.vocab_size == 1000
  assert separate.describe() == 'vocabularies en 1,000 and de 1,000'
  for lang in ('de', 'en'):
    path = datasets.resolve(config).tokenizer_file(lang)
    assert path.name.endswith(f'-bpe-1000-{lang}.model') and separate.by_language[lang].model_path == path
  text = datasets.load_split_text(datasets.resolve(config), 'validation')
  for tokenizer, own, other in ((separate.source, text.source, text.reference),
                                (separate.target, text.reference, text.source)):
    assert [tokenizer.decode(ids) for ids in tokenizer.encode_batch(own)] == own
    # Trained on one language only, each model cuts its own language into longer pieces than the
    # other's: far fewer tokens per sentence.
    assert mean_tokens(tokenizer, own) < 0.7 * mean_tokens(tokenizer, other)
  # The other direction reuses the same two models: they depend on the language, not the direction.
  _, reverse = config_and_vocabularies(multi30k_config, 'separate', 'de', 'en')
  assert reverse.source.fingerprint == separate.target.fingerprint
  assert reverse.target.fingerprint == separate.source.fingerprint
  assert reverse.fingerprint == separate.fingerprint


def test_a_joint_vocabulary_is_one_tokenizer_under_both_languages(multi30k_config):
  config, joint = config_and_vocabularies(multi30k_config, 'joint')
  assert joint.joint and joint.source is joint.target
  assert joint.source.model_path == datasets.resolve(config).tokenizer_file()
  # The token-id caches written before separate vocabularies existed keep their names.
  assert joint.fingerprint == joint.source.fingerprint
  assert joint.describe() == 'vocabulary 1,000'
  _, separate = config_and_vocabularies(multi30k_config, 'separate')
  assert len({joint.fingerprint, separate.fingerprint, separate.source.fingerprint,
              separate.target.fingerprint}) == 4


def test_token_ids_are_cached_per_vocabularies_and_encode_each_language_with_its_own(multi30k_config):
  config, joint = config_and_vocabularies(multi30k_config, 'joint')
  _, separate = config_and_vocabularies(multi30k_config, 'separate')
  lines = datasets.load_examples(datasets.resolve(config), 'validation')
  joint_ids = token_ids.load(datasets.resolve(config), joint, 'validation')
  separate_ids = token_ids.load(datasets.resolve(config), separate, 'validation')
  for lang in ('de', 'en'):
    for vocabularies, ids in ((joint, joint_ids), (separate, separate_ids)):
      expected = vocabularies.by_language[lang].encode_batch(lines[lang][:20])
      assert [list(ids[lang].ids[ids[lang].offsets[i]:ids[lang].offsets[i + 1]])
              for i in range(20)] == expected
  # Read again from the cache, each vocabulary's ids are its own, not the other's.
  again = token_ids.load(datasets.resolve(config), separate, 'validation')
  np.testing.assert_array_equal(again['de'].ids, separate_ids['de'].ids)
  assert len(again['de'].ids) != len(joint_ids['de'].ids)


@pytest.mark.parametrize('source_lang, target_lang', [('en', 'de'), ('de', 'en')])
def test_batches_of_separate_vocabularies_decode_to_the_pairs(multi30k_config, source_lang, target_lang):
  config, separate = config_and_vocabularies(multi30k_config, 'separate', source_lang, target_lang)
  config.pack_length = config.max_tokens // 4
  text = datasets.load_split_text(datasets.resolve(config), 'train')
  pairs = set(zip(text.source, text.reference))
  batch = next(pipeline.make_train_iterator(datasets.resolve(config), separate, seed=0))
  for row in range(3):
    sources = pipeline_row_text(batch['encoder_input_tokens'][row], separate.source)
    targets = pipeline_row_text(batch['decoder_target_tokens'][row], separate.target)
    # Packed rows: every pair of the row, in order, each side decoded with its own vocabulary.
    assert len(sources) == len(targets) > 0
    assert set(zip(sources, targets)) <= pairs
  eval_text = datasets.load_split_text(datasets.resolve(config), 'test_mscoco_2017')
  for batch in pipeline.make_eval_batches(datasets.resolve(config), separate, 'test_mscoco_2017',
                                          32):
    for row, index in enumerate(batch['example_index']):
      if index >= 0:
        assert separate.source.decode(batch['encoder_input_tokens'][row]) == eval_text.source[index]
        assert separate.target.decode(batch['decoder_target_tokens'][row]) == eval_text.reference[index]


def pipeline_row_text(row, tokenizer) -> list[str]:
  """The texts of a packed row's sequences, each ended by EOS."""
  ends = np.flatnonzero(row == tokenizer_lib.EOS_ID)
  starts = np.concatenate([[0], ends[:-1] + 1])
  return [tokenizer.decode(row[start:end]) for start, end in zip(starts, ends)]


@pytest.mark.parametrize('overrides, message', [
    ({'data.vocabulary': 'shared'}, "config.data.vocabulary='shared' is not one of: joint, separate"),
    ({'data.vocabulary': 'separate'},
     r"config.data.vocabulary='separate' gives each language its own token ids, so "
     r'config.model.share_embeddings=True would embed two words with one vector; set it to False'),
])
def test_bad_vocabulary_settings_are_named_before_anything_is_built(overrides, message):
  config = base.get_config()
  config.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=f'^{message}$'):
    config_checks.check_config(config)


def test_the_analyses_refuse_separate_vocabularies_before_preparing_anything(tmp_path):
  config = base.get_config().data
  config.update(vocabulary='separate', cache_dir=str(tmp_path / 'cache'))
  with pytest.raises(ValueError, match=r"^config.data.vocabulary='separate': the analyses build "):
    experiment.load_batches(config, 'validation', 8, batch_size=8)
  assert not (tmp_path / 'cache').exists()


def test_a_run_with_separate_vocabularies_trains_and_eval_reads_sources_with_the_source_one(
    tmp_path, data_cache):
  workdir = tmp_path / 'separate'
  config = smoke.get_config()
  config.data.update(cache_dir=str(data_cache), vocabulary='separate', source_lang='en',
                     target_lang='de')
  config.model.share_embeddings = False
  config.train.update(num_steps=4, eval_every=4, checkpoint_every=4, log_every=4)
  trainer.train_and_evaluate(config, str(workdir))
  assert run_dir.tokenizer_files(datasets.resolve(config.data)) == {
      'en': 'tokenizer.en.model', 'de': 'tokenizer.de.model'}
  assert not (workdir / run_dir.TOKENIZER_FILE).exists()
  for lang in ('de', 'en'):
    cached = datasets.resolve(config.data).tokenizer_file(lang)
    assert (workdir / f'tokenizer.{lang}.model').read_bytes() == cached.read_bytes()
  assert json.load(open(workdir / 'status.json'))['state'] == 'finished'

  mesh = partitioning.make_mesh()
  run = trained_model.restore(str(workdir), 'test_mscoco_2017', 'last', mesh)
  assert not run.vocabularies.joint
  params = run.variables['params']
  assert params['source_embedding']['embedding'].shape[0] == run.vocabularies.source.vocab_size
  assert params['target_embedding']['embedding'].shape[0] == run.vocabularies.target.vocab_size
  # eval.py reads a split through the cached token ids and free text through the source tokenizer;
  # both must give the same translations, which they would not if either encoded English with the
  # German vocabulary.
  settings = {'beam_size': 2, 'length_penalty': 1.0, 'length_penalty_form': 'fairseq',
              'max_length_a': 2, 'max_length_b': 0.5}
  sources = datasets.load_split_text(run.data, 'test_mscoco_2017').source
  from_split, _ = eval_lib.translate_split(run, 'test_mscoco_2017', settings, 32, mesh)
  from_lines = LineTranslator(run, settings, 16, 1, mesh)(sources[:16])
  assert [hypotheses[0][1] for hypotheses in from_lines] == from_split[:16]
