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
from training import trainer
from evaluation import translating

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
  sources = datasets.load_split_text(datasets.resolve(config.data), 'validation').source
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


def _fake_sweep(run_dir: Path, sweep_dir: Path, position: str, shifts: list[tuple[float, float]]) -> None:
  """A sweep of copies of one scored run, seed s with every bucket's (BLEU, loss) moved by shifts[s]."""
  names = [f'position={position},seed={seed}' for seed in range(len(shifts))]
  for seed, (name, (bleu, loss)) in enumerate(zip(names, shifts)):
    shutil.copytree(run_dir, sweep_dir / name)
    config = json.loads((sweep_dir / name / 'config.json').read_text())
    config['model']['position'], config['train']['seed'] = position, seed
    (sweep_dir / name / 'config.json').write_text(json.dumps(config))
    scored = sweep_dir / name / length_buckets.OUT_DIR / 'validation.json'
    record = json.loads(scored.read_text())
    for bucket in record['buckets']:
      bucket['bleu'] += bleu
      bucket['loss_per_token'] += loss
    scored.write_text(json.dumps(record))
  (sweep_dir / sweeps.SWEEP_FILE).write_text(json.dumps({
      'config': 'configs/sweeps/length_extrapolation.py', 'extra_args': [],
      'fields': ['model.position', 'train.seed'],
      'runs': [{'name': name, 'overrides': {'model.position': position, 'train.seed': seed}}
               for seed, name in enumerate(names)]}))


def test_summary_over_seeds_gives_mean_and_spread_per_bucket(short_run, tmp_path):
  workdir, _ = short_run
  length_buckets.score_run(str(workdir), ['validation'])
  sweep_dir = tmp_path / 'sweep'
  # The second "seed" scores 1 BLEU and 0.5 nats higher in every bucket.
  _fake_sweep(workdir, sweep_dir, 'sinusoidal', [(0.0, 0.0), (1.0, 0.5)])
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


def test_gap_to_the_all_lengths_reference_is_the_difference_of_means(short_run, tmp_path):
  workdir, _ = short_run
  length_buckets.score_run(str(workdir), ['validation'])
  short, reference = tmp_path / 'short', tmp_path / 'all_lengths'
  _fake_sweep(workdir, short, 'sinusoidal', [(0.0, 0.0), (1.0, 0.5)])  # means: +0.5 BLEU, +0.25 nats
  _fake_sweep(workdir, reference, 'sinusoidal', [(2.0, -0.3)])
  groups = length_buckets.summarise(str(short), 'validation')
  references = length_buckets.summarise(str(reference), 'validation')
  [loss_row] = length_buckets.gaps(groups, references, 'loss_per_token')
  [bleu_row] = length_buckets.gaps(groups, references, 'bleu')
  assert (loss_row['seeds'], loss_row['reference_seeds']) == (2, 1)
  present = [b['sentences'] > 0 for b in groups[0]['buckets']]
  assert [gap is not None for gap in loss_row['gaps']] == present
  assert [gap for gap in loss_row['gaps'] if gap is not None] == pytest.approx([0.55] * sum(present))
  assert [gap for gap in bleu_row['gaps'] if gap is not None] == pytest.approx([-1.5] * sum(present))

  command = [sys.executable, '-m', 'scripts.length_extrapolation', str(short), '--splits=validation']
  result = subprocess.run([*command, f'--reference={reference}'], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  markdown = (short / 'length_extrapolation.md').read_text()
  assert '| position=sinusoidal | 2 | 1 | +0.550 |' in markdown.replace(' | –', '')

  other = tmp_path / 'other'
  _fake_sweep(workdir, other, 'alibi', [(0.0, 0.0)])
  result = subprocess.run([*command, f'--reference={other}'], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f'length_extrapolation.py: reference {other}: none of its scored runs (validation) has the swept '
      f'values of a run of {short}')
