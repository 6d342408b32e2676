"""eval.py on a smoke run, its bad inputs, and the decoding and averaging it relies on."""

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import sacrebleu
import sacremoses
from absl import flags

import eval as eval_lib
from configs import base, smoke
from data import datasets
from model.config import ModelConfig
from model.transformer import Transformer
from model.translate import beam_translate, translate
from training import partitioning, train_state, trainer
from evaluation.line_translator import LineTranslator
from evaluation import averaging, trained_model, translating
from training.checkpointing import Checkpointer
from tests.sweep_fixtures import xla_flags

REPO = Path(__file__).resolve().parents[1]
PAD, EOS, BOS = 0, 1, 2
SOURCE = np.array([[5, 6, 7, 8, 9, 1, 0, 0], [10, 11, 1, 0, 0, 0, 0, 0], [4, 12, 13, 14, 15, 16, 17, 1]])
# 461 short sentences: the cheapest Multi30k test split.
SPLIT = 'test_mscoco_2017'


def tiny_model(vocab: int, layers: int = 2) -> Transformer:
  config = base.get_config().model
  config.update(d_model=32, num_heads=2, d_ff=64, num_encoder_layers=layers, num_decoder_layers=layers,
                dropout_rate=0.0)
  return Transformer(ModelConfig.from_config(config, source_vocab_size=vocab, target_vocab_size=vocab))


@pytest.fixture(scope='module')
def random_model():
  model = tiny_model(vocab=23)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), SOURCE, SOURCE[:, :4])
  # A trained model never predicts padding, which the full forward pass would mask and the
  # cache would not: a zero padding embedding (tied to the output) keeps its logit below the best.
  embedding = variables['params']['source_embedding']['embedding']
  variables['params']['source_embedding']['embedding'] = embedding.at[PAD].set(0.0)
  return model, variables


def test_greedy_with_cache_equals_argmax_of_the_full_forward_pass(random_model):
  model, variables = random_model
  a, b = 3, 1.0
  greedy = np.asarray(translate(model, variables, SOURCE, max_length_a=a, max_length_b=b))  # [B, T]
  limits = np.floor(a + b * (SOURCE != PAD).sum(1)).astype(int)  # EOS forced as token number `limit`
  # Teacher-forced, no cache; the decoder input has a fixed width, as the positions after t are
  # padding that the causal mask hides from position t.
  forward = jax.jit(model.apply)
  decoder_input = np.zeros_like(greedy)
  decoder_input[:, 0] = BOS
  expected = np.zeros_like(greedy)
  finished = np.zeros(len(SOURCE), bool)
  for t in range(greedy.shape[1]):
    logits = forward(variables, SOURCE, decoder_input)  # [B, T, V]
    tokens = np.where(t == limits - 1, EOS, np.asarray(logits[:, t]).argmax(-1))
    tokens = np.where(finished, PAD, tokens)
    finished |= tokens == EOS
    expected[:, t] = tokens
    if t + 1 < greedy.shape[1]:
      decoder_input[:, t + 1] = tokens
  assert finished.all()
  np.testing.assert_array_equal(greedy, expected)


def test_beam_size_one_equals_greedy(random_model):
  model, variables = random_model
  greedy = translate(model, variables, SOURCE, beam_size=1)
  tokens, _ = beam_translate(model, variables, SOURCE, beam_size=1, length_penalty=0.0)
  np.testing.assert_array_equal(tokens[:, 0], greedy)


@pytest.mark.parametrize('alpha', [0.0, 1.0])
def test_beam_scores_are_the_full_forward_log_probabilities_of_their_hypotheses(random_model, alpha):
  # The cached search reads each sentence's cross-attention keys/values once for its K beams and
  # reorders only the self-attention cache; any row mix-up would show as a score that is not the
  # teacher-forced log-probability of the hypothesis it came with.
  model, variables = random_model
  beams = 3
  tokens, scores = beam_translate(model, variables, SOURCE, beam_size=beams, length_penalty=alpha)
  tokens, scores = np.asarray(tokens), np.asarray(scores)  # [B, K, T], [B, K]
  assert np.isfinite(scores).all()
  width = tokens.shape[2]
  decoder_input = np.concatenate([np.full((*tokens.shape[:2], 1), BOS), tokens[:, :, :-1]], axis=2)
  log_probs = jax.nn.log_softmax(jax.jit(model.apply)(
      variables, np.repeat(SOURCE, beams, axis=0), decoder_input.reshape(-1, width)))  # [B*K, T, V]
  log_probs = np.asarray(log_probs).reshape(*tokens.shape, -1)
  for b, k in np.ndindex(*scores.shape):
    ends = np.flatnonzero(tokens[b, k] == EOS)
    length = ends[0] + 1 if len(ends) else width
    assert (tokens[b, k, :length] != PAD).all()
    total = log_probs[b, k, np.arange(length), tokens[b, k, :length]].sum()
    np.testing.assert_allclose(scores[b, k], total / length**alpha, rtol=1e-5, atol=1e-5)
  assert (np.diff(scores, axis=1) <= 0).all()  # best first


def reversal_arrays(sequences, width=8):
  """Source + EOS, BOS + reversed source, reversed source + EOS: [N, width] each."""
  source, decoder_input, target = (np.zeros((len(sequences), width), np.int32) for _ in range(3))
  for row, sequence in enumerate(sequences):
    n = len(sequence)
    source[row, :n + 1] = (*sequence, EOS)
    decoder_input[row, :n + 1] = (BOS, *sequence[::-1])
    target[row, :n + 1] = (*sequence[::-1], EOS)
  return source, decoder_input, target


def test_tiny_trained_model_reverses_held_out_sequences():
  rng = np.random.default_rng(0)
  sample = lambda n: {tuple(rng.integers(4, 20, rng.integers(3, 7))) for _ in range(n)}
  pool = sorted(sample(3000))
  held_out = sorted(sample(200) - set(pool))[:64]
  # Two layers and a rate decayed to zero, so that no CPU's float32 rounding decides the result:
  # one layer at a constant 5e-3 got every sequence right after 1000 steps on an AMD EPYC Zen 4 VM
  # but dropped a repeated token of one on an Intel Xeon VM. Two decayed layers got all 64
  # right there after 600, 750 and 1000 steps.
  model = tiny_model(vocab=20, layers=2)
  tx = optax.adam(optax.cosine_decay_schedule(5e-3, 1000))
  state = train_state.create_train_state(model, tx, seed=0)
  # The one program here that runs 1000 times: LLVM's optimisation, off for the tests' many
  # short-lived programs (tests/conftest.py), makes each step 2.5x faster for ~1 s more compiling.
  step = jax.jit(functools.partial(train_state.train_step, model=model, tx=tx, label_smoothing=0.0,
                                   dropout_key=jax.random.PRNGKey(1)),
                 compiler_options={'xla_backend_optimization_level': 3})
  for _ in range(1000):
    source, decoder_input, target = reversal_arrays([pool[i] for i in rng.integers(0, len(pool), 64)])
    state, _ = step(state, {'encoder_input_tokens': source, 'decoder_input_tokens': decoder_input,
                            'decoder_target_tokens': target,
                            'decoder_target_weights': (target != PAD).astype(np.float32)})
  source, _, target = reversal_arrays(held_out)
  for beam_size in (1, 4):
    tokens = np.asarray(translate(model, {'params': state.params}, jnp.asarray(source), beam_size=beam_size))
    np.testing.assert_array_equal(tokens[:, :target.shape[1]], target)
    assert not tokens[:, target.shape[1]:].any()


def test_average_of_the_latest_checkpoints_is_their_mean(tmp_path):
  rng = np.random.default_rng(0)
  trees = [{'dense': {'kernel': rng.normal(size=(3, 4)).astype(np.float32)},
            'bias': rng.normal(size=(4,)).astype(np.float32)} for _ in range(4)]
  checkpointer = Checkpointer(tmp_path, keep=5, save_every=1)
  for step, tree in enumerate(trees, start=1):
    checkpointer.save(step, tree, {})
  steps = averaging.latest_steps(checkpointer, 3)
  averaged = averaging.load_average(checkpointer, steps, jax.eval_shape(lambda: trees[0]))
  checkpointer.close()
  assert steps == [2, 3, 4]
  for leaf, *leaves in zip(jax.tree.leaves(averaged), *map(jax.tree.leaves, trees[1:])):
    assert leaf.dtype == np.float32
    np.testing.assert_allclose(leaf, np.mean(leaves, axis=0), rtol=1e-6)


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory, data_cache):
  """A smoke run with checkpoints at steps 2, 4 and 6, whose config asks for beam size 2."""
  workdir = tmp_path_factory.mktemp('smoke_eval')
  config = smoke.get_config()
  config.data.cache_dir = str(data_cache)
  config.train.update(num_steps=6, checkpoint_every=2, keep_checkpoints=3, eval_every=6, log_every=6)
  config.eval.beam_size = 2
  trainer.train_and_evaluate(config, str(workdir))
  return workdir, config


def run_eval(*args, stdin=None):
  return subprocess.run([sys.executable, 'eval.py', *args], cwd=REPO, capture_output=True, text=True,
                        timeout=300, input=stdin)


def moses_lowercase(lines):
  """Multi30k's recipe for its lc.norm.tok files, written out independently of eval.py."""
  normaliser, tokenizer = sacremoses.MosesPunctNormalizer(lang='en'), sacremoses.MosesTokenizer(lang='en')
  return [tokenizer.tokenize(normaliser.normalize(line), return_str=True).lower() for line in lines]


# Short limits keep the untrained model's hypotheses, hence the eval.py runs, short.
DECODING_FLAGS = ('--checkpoint=avg:2', '--batch_size=64', '--max_length_a=2', '--max_length_b=0.5')


@pytest.fixture(scope='module')
def one_device_eval(smoke_run):
  """eval.py on one device with one loop per batch (--smallest_batch=64), the plainest search;
  its report and hypotheses go to the default WORKDIR/eval."""
  workdir, _ = smoke_run
  result = run_eval(f'--workdir={workdir}', f'--split={SPLIT}', *DECODING_FLAGS, '--cpu_devices=1',
                    '--smallest_batch=64')
  assert result.returncode == 0, result.stderr[-2000:]
  return result


def test_eval_report_equals_sacrebleu_on_the_written_hypotheses(smoke_run, one_device_eval):
  workdir, config = smoke_run
  report = json.load(open(workdir / 'eval' / f'{SPLIT}.json'))
  hypotheses = (workdir / 'eval' / f'{SPLIT}.hyp.txt').read_text().split('\n')
  assert hypotheses.pop() == ''  # the file ends with a newline
  text = datasets.load_split_text(datasets.resolve(config.data), SPLIT)
  assert len(hypotheses) == len(text.source) == report['sentences'] == 461
  assert report['checkpoint_steps'] == [4, 6]
  assert report['decoding'] == {'beam_size': 2, 'length_penalty': 1.0, 'length_penalty_form': 'fairseq',
                                'early_stopping': False, 'smallest_batch': 64,
                                'max_length_a': 2, 'max_length_b': 0.5, 'batch_size': 64}
  bleu = sacrebleu.metrics.BLEU()
  assert report['bleu'] == bleu.corpus_score(hypotheses, [text.reference]).score
  assert report['bleu_signature'] == str(bleu.get_signature())
  assert report['chrf'] == sacrebleu.corpus_chrf(hypotheses, [text.reference]).score
  # The recipe reproduces the tokenized references from the original ones.
  assert moses_lowercase(text.reference) == text.reference_tokenized
  assert report['tokenized_bleu'] == sacrebleu.corpus_bleu(
      moses_lowercase(hypotheses), [text.reference_tokenized], tokenize='none').score
  assert [bucket['count'] for bucket in report['buckets']] == [
      sum(lo <= max(len(s.split()), 1) <= hi for s in text.source)
      for lo, hi in [(1, 10), (11, 20), (21, 30), (31, 40), (41, 10**9)]]
  assert report['decode_s'] > 0 and report['wall_s'] > report['decode_s'] + report['compile_s']
  assert report['sentences_per_sec'] == pytest.approx(461 / report['decode_s'])
  assert 'tokenized BLEU' in one_device_eval.stdout


def test_hypotheses_do_not_depend_on_how_the_cpu_is_split(smoke_run, one_device_eval, tmp_path):
  """Each device searches its own rows (partitioning.per_device_rows): the split changes nothing.

  The reference is the one-device search of `one_device_eval`; here four devices each drop
  finished sentences from their 16 rows as they go (16, then 8)."""
  workdir, _ = smoke_run
  result = run_eval(f'--workdir={workdir}', f'--split={SPLIT}', *DECODING_FLAGS, '--cpu_devices=4',
                    '--smallest_batch=8', f'--out_dir={tmp_path}')
  assert result.returncode == 0, result.stderr[-2000:]
  assert json.load(open(workdir / 'eval' / f'{SPLIT}.json'))['devices'] == '1 x cpu'
  assert json.load(open(tmp_path / f'{SPLIT}.json'))['devices'] == '4 x cpu'
  reference = (workdir / 'eval' / f'{SPLIT}.hyp.txt').read_text()
  assert (tmp_path / f'{SPLIT}.hyp.txt').read_text() == reference and len(reference.splitlines()) == 461


def test_unset_decoding_flags_come_from_the_config_and_one_search_loop_of_the_batch():
  config = base.get_config()
  flag_settings = {'beam_size': None, 'length_penalty': None, 'smallest_batch': None}
  settings, batch_size = eval_lib.decoding_settings(config, flag_settings, None)
  assert batch_size == config.data.eval_batch_size
  assert settings == {'beam_size': config.eval.beam_size, 'length_penalty': config.eval.length_penalty,
                      'smallest_batch': batch_size}
  settings, batch_size = eval_lib.decoding_settings(
      config, dict(flag_settings, beam_size=3, smallest_batch=16), 96)
  assert (settings['beam_size'], settings['smallest_batch'], batch_size) == (3, 16, 96)


def test_scores_of_imperfect_hypotheses_equal_sacrebleu(smoke_run):
  """Non-trivial scores, which the smoke model's hypotheses are not."""
  _, config = smoke_run
  text = datasets.load_split_text(datasets.resolve(config.data), SPLIT)
  # Every other line loses its last word, every third is lowercased.
  hypotheses = [' '.join(line.split()[:-1]) if i % 2 else line for i, line in enumerate(text.reference)]
  hypotheses = [line.lower() if i % 3 == 0 else line for i, line in enumerate(hypotheses)]
  scores = translating.score(hypotheses, text, datasets.resolve(config.data))
  assert 30 < scores['bleu'] < 95 and scores['tokenized_bleu'] > scores['bleu']
  assert scores['tokenized_bleu'] == sacrebleu.corpus_bleu(
      moses_lowercase(hypotheses), [text.reference_tokenized], tokenize='none').score
  short = [i for i, source in enumerate(text.source) if len(source.split()) <= 10]
  assert scores['buckets'][0]['bleu'] == sacrebleu.corpus_bleu(
      [hypotheses[i] for i in short], [[text.reference[i] for i in short]]).score
  assert scores['buckets'][-1] == {'source_words': '41+', 'count': 0, 'bleu': None}


def test_translating_lines_batched_by_length_equals_one_at_a_time(smoke_run):
  workdir, config = smoke_run
  mesh = partitioning.make_mesh()
  run = trained_model.restore(str(workdir), None, 'last', mesh)
  settings = {'beam_size': 2, 'length_penalty': 1.0, 'length_penalty_form': 'fairseq',
              'max_length_a': 2, 'max_length_b': 0.5}
  lines = datasets.load_split_text(datasets.resolve(config.data), SPLIT).source[:7]
  lines.insert(3, '')
  translator = LineTranslator(run, settings, 4, 2, mesh)
  together = translator(lines)
  assert together[3] == [(0.0, '')] * 2  # an empty line is not translated, but keeps its place
  for line, hypotheses in zip(lines, together):
    if line:
      alone = translator([line])[0]
      # Other batch shapes round the float32 scores differently.
      assert [text for _, text in hypotheses] == [text for _, text in alone]
      np.testing.assert_allclose([score for score, _ in hypotheses], [score for score, _ in alone],
                                 rtol=1e-5)
      assert len(hypotheses) == 2 and hypotheses[0][0] >= hypotheses[1][0]


def test_translate_command_writes_one_line_per_input_line(smoke_run, tmp_path):
  workdir, _ = smoke_run
  (tmp_path / 'in.txt').write_text('Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen im Schnee.\n')
  result = run_eval(f'--workdir={workdir}', f'--input={tmp_path / "in.txt"}',
                    f'--output={tmp_path / "out.txt"}', '--max_length_a=2', '--max_length_b=0.5')
  assert result.returncode == 0, result.stderr[-2000:]
  lines = (tmp_path / 'out.txt').read_text(encoding='utf-8').split('\n')
  assert len(lines) == 4 and lines[1] == lines[3] == ''
  result = run_eval(f'--workdir={workdir}', '--input=-', '--nbest=2', '--max_length_a=2',
                    '--max_length_b=0.5', stdin='Ein Hund.\n')
  assert result.returncode == 0, result.stderr[-2000:]
  rows = [line.split('\t') for line in result.stdout.splitlines()]
  assert [row[0] for row in rows] == ['1', '1'] and float(rows[0][1]) >= float(rows[1][1])


def test_attention_maps_draws_one_png_per_decoder_layer(smoke_run, tmp_path):
  workdir, config = smoke_run
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.attention_maps', f'--workdir={workdir}', '--split=test_2016',
       '--index=2', '--heads', f'--out_dir={tmp_path}'], cwd=REPO, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  layers = config.model.num_decoder_layers
  assert sorted(p.name for p in tmp_path.iterdir()) == [f'layer_{i}.png' for i in range(layers)]
  assert all(p.read_bytes().startswith(b'\x89PNG') for p in tmp_path.iterdir())


BAD_INPUTS = {
    'no_config': (['--workdir={root}/empty'], 'no config.json in'),
    'no_checkpoint': (['--workdir={root}/untrained'], 'no checkpoint in'),
    'unknown_split': (['--workdir={run}', '--split=test_2099'],
                      "Unknown multi30k split 'test_2099'; valid: train, validation, test_2016"),
    'bad_checkpoint': (['--workdir={run}', '--checkpoint=newest'], "--checkpoint='newest' is not 'last'"),
    'unsaved_step': (['--workdir={run}', '--checkpoint=5'], '--checkpoint=5: no such checkpoint'),
    'too_many_to_average': (['--workdir={run}', '--checkpoint=avg:9'], 'cannot average 9 checkpoints'),
    'incompatible_config': (['--workdir={root}/edited'], 'checkpoints/6 does not match the model of'),
    'no_tokenizer': (['--workdir={root}/no_tokenizer'], 'no tokenizer.model in'),
    'split_and_input': (['--workdir={run}', '--split=test_2016', '--input={root}/ok.txt'],
                        'Exactly one of (split, input)'),
    'not_utf8': (['--workdir={run}', '--input={root}/latin1.txt'], '--input line 2 is not valid UTF-8'),
    'nbest_above_beam': (['--workdir={run}', '--input={root}/ok.txt', '--nbest=3'],
                         '--nbest=3 exceeds the beam size 2'),
    'line_too_long': (['--workdir={run}', '--input={root}/ok.txt', '--max_length_a=5000'],
                      "generated tokens it exceeds the model's max_position 1024; split the line"),
}


# Run as eval.py processes: a check of `evaluate` and one of absl's flag parsing, each printed by
# the program as its last stderr line. The other cases call `evaluate` in this process: the same
# checks, without a process start (~4 s of imports) each.
AS_PROCESSES = ('no_config', 'split_and_input')


@pytest.fixture(scope='module')
def bad_input_root(smoke_run, tmp_path_factory):
  """A folder of broken runs and input files beside the smoke run."""
  run, _ = smoke_run
  root = tmp_path_factory.mktemp('bad_inputs')
  (root / 'empty').mkdir()
  (root / 'untrained').mkdir()
  shutil.copy(run / 'config.json', root / 'untrained')
  shutil.copytree(run / 'checkpoints', root / 'edited' / 'checkpoints')
  shutil.copy(run / 'tokenizer.model', root / 'edited')
  shutil.copytree(run / 'checkpoints', root / 'no_tokenizer' / 'checkpoints')
  shutil.copy(run / 'config.json', root / 'no_tokenizer')
  (root / 'ok.txt').write_text('Ein Hund.\n')
  (root / 'latin1.txt').write_bytes('Ein Hund.\nZwei Männer.\n'.encode('latin-1'))
  config = json.load(open(run / 'config.json'))
  config['model']['d_model'] = 64
  json.dump(config, open(root / 'edited' / 'config.json', 'w'))
  return root


def bad_input_argv(case, root, run):
  args = [arg.format(root=root, run=run) for arg in BAD_INPUTS[case][0]]
  mode = [] if any(arg.startswith(('--input', '--split')) for arg in args) else ['--split=test_2016']
  return [*mode, *args]


@pytest.fixture(scope='module')
def bad_input_processes(smoke_run, bad_input_root):
  """Return code and stderr of eval.py per AS_PROCESSES case, the processes run side by side."""
  run, _ = smoke_run
  processes = {case: subprocess.Popen([sys.executable, 'eval.py', *bad_input_argv(case, bad_input_root, run)],
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for case in AS_PROCESSES}
  results = {}
  for case, process in processes.items():
    _, stderr = process.communicate(timeout=300)  # not wait(): a full stderr pipe would block it
    results[case] = process.returncode, stderr
  return results


@pytest.mark.parametrize('case', AS_PROCESSES)
def test_bad_input_to_the_program_fails_with_one_clear_line(bad_input_processes, case):
  returncode, stderr = bad_input_processes[case]
  assert returncode != 0
  assert BAD_INPUTS[case][1] in stderr.strip().splitlines()[-1]


def eval_in_process(*argv):
  """eval.py's command line parsed and evaluated in this process: its one-line exit message."""
  args = flags.FlagValues()
  eval_lib.define_flags(args)
  args(['eval.py', *argv])
  # The CPU's devices are fixed once JAX has started; XLA_FLAGS naming their count is what tells
  # eval.py to leave them as they are.
  with mock.patch.dict(os.environ, XLA_FLAGS=xla_flags(jax.device_count())), \
      pytest.raises(SystemExit) as exit:
    eval_lib.evaluate_or_exit(args, start=0.0)
  assert exit.value.code.startswith('eval.py: ') and '\n' not in exit.value.code
  return exit.value.code


@pytest.mark.parametrize('case', [case for case in BAD_INPUTS if case not in AS_PROCESSES])
def test_bad_input_fails_with_one_clear_line(smoke_run, bad_input_root, case):
  run, _ = smoke_run
  assert BAD_INPUTS[case][1] in eval_in_process(*bad_input_argv(case, bad_input_root, run))
  # Checks run before a Checkpointer would create the folder.
  assert not (bad_input_root / 'untrained' / 'checkpoints').exists()


def test_a_run_saved_before_a_config_field_existed_still_opens(smoke_run, tmp_path):
  run, _ = smoke_run
  saved = json.load(open(run / 'config.json'))
  default = saved['train'].pop('divergence_growth')  # as if saved before the field was added
  saved['train']['save_on_stop_after'] = 7
  json.dump(saved, open(tmp_path / 'config.json', 'w'))
  config = trained_model.load_config(str(tmp_path))
  assert config.train.divergence_growth == default and config.train.save_on_stop_after == 7
  saved['model']['d_model'] = 'wide'
  json.dump(saved, open(tmp_path / 'config.json', 'w'))
  with pytest.raises(ValueError, match=r"config.json: Could not override field 'd_model'"):
    trained_model.load_config(str(tmp_path))
