"""Length extrapolation: per-bucket scoring of a trained run against its own validation loss, and
the summary over seeds (analysis/length_buckets.py, scripts/length_extrapolation.py)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import length_buckets
from configs import smoke
from data import datasets
from experiments import sweeps
from training import trainer, translating

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def short_run(tmp_path_factory, data_cache):
  """A smoke run trained on sources of at most 8 words, validated on the whole validation split."""
  workdir = tmp_path_factory.mktemp('length') / 'sweep' / 'position=sinusoidal,seed=0'
  config = smoke.get_config()
  config.data.update(cache_dir=str(data_cache), train_max_source_words=8, eval_examples=0)
  config.train.update(num_steps=4, checkpoint_every=4, eval_every=4, log_every=4)
  trainer.train_and_evaluate(config, str(workdir))
  return workdir, config


def test_bucket_boundaries():
  assert length_buckets.bucket_names() == ['1-5', '6-10', '11-15', '16-20', '21+']
  sources = [' '.join(['w'] * words) for words in (1, 5, 6, 10, 11, 20, 21, 40)]
  np.testing.assert_array_equal(translating.source_buckets(sources, length_buckets.BUCKET_ENDS),
                                [0, 0, 1, 1, 2, 3, 4, 4])


def test_buckets_partition_the_split_and_their_losses_average_to_the_validation_loss(short_run):
  workdir, config = short_run
  scored = length_buckets.score_run(str(workdir), ['validation'])['validation']
  sources = datasets.load_split_text(config.data, 'validation').source
  words = np.array([len(source.split()) for source in sources])
  assert [b['sentences'] for b in scored] == [
      int(((words > low) & (words <= high)).sum()) for low, high in ((0, 5), (5, 10), (10, 15), (15, 20), (20, 10**6))]
  # Token-weighted, the buckets' losses are the loss over the whole split, which train.py's
  # validation computed at the same step with the same parameters.
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  eval_loss = [r['eval_loss'] for r in records if 'eval_loss' in r][-1]
  total = sum(b['loss_per_token'] * b['target_tokens'] for b in scored) / sum(b['target_tokens'] for b in scored)
  assert total == pytest.approx(eval_loss, rel=1e-5)
  saved = json.loads((workdir / length_buckets.OUT_DIR / 'validation.json').read_text())
  assert saved['train_max_source_words'] == 8 and saved['buckets'] == scored


def test_summary_over_seeds_gives_mean_and_spread_per_bucket(short_run, tmp_path):
  workdir, _ = short_run
  length_buckets.score_run(str(workdir), ['validation'])
  sweep_dir = tmp_path / 'sweep'
  names = ['position=sinusoidal,seed=0', 'position=sinusoidal,seed=1']
  for name in names:
    shutil.copytree(workdir, sweep_dir / name)
  # The second "seed" scores 1 BLEU and 0.5 nats higher in every bucket.
  second = sweep_dir / names[1] / length_buckets.OUT_DIR / 'validation.json'
  record = json.loads(second.read_text())
  for bucket in record['buckets']:
    bucket['bleu'] += 1.0
    bucket['loss_per_token'] += 0.5
  second.write_text(json.dumps(record))
  (sweep_dir / sweeps.SWEEP_FILE).write_text(json.dumps({
      'config': 'configs/sweeps/length_extrapolation.py', 'extra_args': [],
      'fields': ['model.position', 'train.seed'],
      'runs': [{'name': name, 'overrides': {'model.position': 'sinusoidal', 'train.seed': seed}}
               for seed, name in enumerate(names)]}))
  [group] = length_buckets.summarise(str(sweep_dir), 'validation')
  first = json.loads((workdir / length_buckets.OUT_DIR / 'validation.json').read_text())['buckets']
  assert group['values'] == {'model.position': 'sinusoidal'} and group['seeds'] == 2
  for mine, theirs in zip(group['buckets'], first):
    assert mine['bleu'] == pytest.approx(theirs['bleu'] + 0.5)
    assert mine['bleu_std'] == pytest.approx(np.std([0.0, 1.0], ddof=1))
    assert mine['loss_per_token_std'] == pytest.approx(np.std([0.0, 0.5], ddof=1))

  result = subprocess.run([sys.executable, '-m', 'scripts.length_extrapolation', str(sweep_dir),
                           '--splits=validation'], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  markdown = (sweep_dir / 'length_extrapolation.md').read_text()
  assert '| position=sinusoidal | 2 |' in markdown
  assert (sweep_dir / 'length_validation.png').read_bytes()[:4] == b'\x89PNG'
