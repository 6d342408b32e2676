"""scripts/report.py on fabricated run folders: table, CSV, plots, a diverged run, resumed records."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import plots, report, results, sweeps

REPO = Path(__file__).resolve().parents[1]
FIELDS = ['model.norm_position', 'optim.warmup_steps']


def fabricate_run(sweep_dir, name, position, warmup, status=None, train=(), evals=(), eval_file=None):
  """A run folder as train.py (and eval.py) leave it: train records (step, loss), evals (step, loss, bleu)."""
  run_dir = sweep_dir / name
  run_dir.mkdir(parents=True)
  config = {'model': {'norm_position': position, 'd_model': 32},
            'optim': {'warmup_steps': warmup}, 'data': {'vocab_size': 1000}}
  (run_dir / 'config.json').write_text(json.dumps(config))
  lines = [{'step': step, 'train_loss': loss, 'tokens_per_sec': speed} for step, loss, speed in train]
  lines += [{'step': step, 'eval_loss': loss, 'bleu': bleu} for step, loss, bleu in evals]
  (run_dir / 'metrics.jsonl').write_text(''.join(json.dumps(line) + '\n' for line in lines))
  if status:
    (run_dir / 'status.json').write_text(json.dumps(dict(zip(('state', 'step'), status))))
  if eval_file:
    (run_dir / 'eval').mkdir()
    (run_dir / 'eval' / 'test_2016.json').write_text(json.dumps(eval_file))


@pytest.fixture
def sweep_dir(tmp_path):
  """Four runs of a 2 x 2 sweep: diverged at step 30, finished (with an eval.py score), finished,
  not started."""
  sweep_dir = tmp_path / 'sweep'
  fabricate_run(sweep_dir, 'norm_position=post,warmup=0', 'post', 0, ('diverged', 30),
                train=[(10, 6.5, 100.0), (20, 40.0, 300.0)])
  fabricate_run(sweep_dir, 'norm_position=post,warmup=500', 'post', 500, ('finished', 40),
                train=[(10, 6.0, 100.0), (20, 5.0, 400.0), (30, 4.5, 500.0), (40, 4.0, 600.0)],
                evals=[(20, 5.1, 3.0), (40, 4.4, 8.0)], eval_file={'bleu': 12.3, 'tokenized_bleu': 14.0})
  fabricate_run(sweep_dir, 'norm_position=pre,warmup=0', 'pre', 0, ('finished', 40),
                train=[(20, 4.5, 200.0), (40, 3.5, 200.0)], evals=[(20, 4.5, 6.0), (40, 4.6, 9.5)])
  overrides = [{'model.norm_position': position, 'optim.warmup_steps': warmup}
               for position in ('post', 'pre') for warmup in (0, 500)]
  names = [f'norm_position={o["model.norm_position"]},warmup={o["optim.warmup_steps"]}' for o in overrides]
  (sweep_dir / sweeps.SWEEP_FILE).write_text(json.dumps({
      'config': 'configs/sweeps/x.py', 'extra_args': [], 'fields': FIELDS,
      'runs': [{'name': name, 'overrides': o} for name, o in zip(names, overrides)]}))
  return sweep_dir


def test_report_tables_every_run_with_its_state_and_scores(sweep_dir, tmp_path):
  out_dir = tmp_path / 'out'
  paths = report.write_report(str(sweep_dir), str(out_dir))
  assert sorted(Path(path).name for path in paths) == [
      'report.csv', 'report.md', 'train_loss.png', 'val_bleu.png', 'val_loss.png']
  for image in ('train_loss.png', 'val_loss.png', 'val_bleu.png'):
    assert (out_dir / image).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  markdown = (out_dir / 'report.md').read_text()
  assert '4 runs, the sweep of `configs/sweeps/x.py`: 1 diverged, 2 finished, 1 not started.' in markdown
  rows = [line.strip('| ').split(' | ') for line in markdown.splitlines() if line.startswith('| ')]
  assert rows[0] == ['run', 'norm_position', 'warmup', 'state', 'final val loss', 'best val loss', 'at step',
                     'final BLEU', 'best BLEU', 'final train loss', 'val loss change, last fifth',
                     'loss spikes', 'tokens/s', 'test_2016 BLEU', 'test_2016 tok. BLEU']
  # 6.5 -> 40.0 is a spike (above 1.5x the window before).
  assert rows[2] == ['norm_position=post,warmup=0', 'post', '0', 'diverged@30', '–', '–', '–', '–', '–',
                     '40.000', '–', '1', '200', '–', '–']
  # Validation loss 5.1 at step 20 (the last at or before 80% of step 40), 4.4 at 40: 13.7%.
  assert rows[3] == ['norm_position=post,warmup=500', 'post', '500', 'finished', '4.400', '4.400', '40',
                     '8.00', '8.00', '4.000', '13.7%', '0', '450', '12.30', '14.00']
  assert rows[4][3:8] == ['finished', '4.600', '4.500', '20', '9.50']  # best before final
  assert rows[4][10] == '2.2%'
  # Not started: the swept values still come from sweep.json.
  assert rows[5] == ['norm_position=pre,warmup=500', 'pre', '500', 'not started'] + ['–'] * 11
  assert '![train_loss](train_loss.png)' in markdown

  with open(out_dir / 'report.csv') as f:
    table = list(csv.DictReader(f))
  assert [row['state'] for row in table] == ['diverged', 'finished', 'finished', 'not started']
  assert table[0]['state_step'] == '30' and table[0]['final_val_loss'] == ''
  assert float(table[1]['best_val_loss']) == 4.4 and float(table[1]['test_2016_tokenized_bleu']) == 14.0
  assert table[3]['warmup'] == '500' and table[3]['median_tokens_per_sec'] == ''


def test_metrics_of_a_resumed_run_keep_its_final_history(tmp_path):
  # Killed after logging step 30, resumed from the step-20 checkpoint, which re-logged 30 and went on.
  records = [{'step': 10, 'train_loss': 6.0}, {'step': 20, 'train_loss': 5.0}, {'step': 20, 'eval_loss': 5.5},
             {'step': 30, 'train_loss': 4.9}, {'step': 30, 'train_loss': 4.5}, {'step': 40, 'train_loss': 4.0}]
  text = ''.join(json.dumps(r) + '\n' for r in records) + '{"step": 50, "train_lo'  # cut by a crash
  (tmp_path / 'metrics.jsonl').write_text(text)
  train, evals = results.read_metrics(str(tmp_path))
  assert [(r['step'], r['train_loss']) for r in train] == [(10, 6.0), (20, 5.0), (30, 4.5), (40, 4.0)]
  assert evals == [{'step': 20, 'eval_loss': 5.5}]


def test_without_sweep_json_the_swept_fields_are_the_config_fields_that_differ(sweep_dir):
  (sweep_dir / sweeps.SWEEP_FILE).unlink()
  runs, fields = results.load_runs(str(sweep_dir))
  assert fields == FIELDS
  assert [run.name for run in runs] == ['norm_position=post,warmup=0', 'norm_position=post,warmup=500',
                                        'norm_position=pre,warmup=0']
  assert runs[2].values == {'model.norm_position': 'pre', 'optim.warmup_steps': 0}


def test_named_fields_and_a_step_compare_runs_of_different_lengths_over_seeds(tmp_path):
  """Seeds of one point whose configs also differ in train.num_steps group by the named fields,
  and --up_to_step reads every run at that step: a longer run's later records are left out."""
  sweep_dir = tmp_path / 'sweep'
  lengths = {0: 40, 1: 40, 2: 80}  # seed 2 ran twice as long
  for seed, num_steps in lengths.items():
    name = f'seed={seed}'
    fabricate_run(sweep_dir, name, 'post', 500, ('finished', num_steps),
                  train=[(step, 6.0 - step / 20 - seed / 10, 100.0) for step in range(20, num_steps + 1, 20)],
                  evals=[(step, 5.0 - step / 40 - seed / 10, step / 4) for step in range(20, num_steps + 1, 20)])
    config_path = sweep_dir / name / 'config.json'
    config = json.loads(config_path.read_text())
    config['train'] = {'seed': seed, 'num_steps': num_steps}
    config_path.write_text(json.dumps(config))

  _, fields = results.load_runs(str(sweep_dir))
  assert fields == ['train.seed', 'train.num_steps']  # alone, the lengths split the seeds
  runs, fields = results.load_runs(str(sweep_dir), compare=['warmup'], up_to_step=40)
  assert fields == ['optim.warmup_steps', 'train.seed']
  assert [[record['step'] for record in run.evals] for run in runs] == [[20, 40]] * 3
  _, rows, csv_rows = results.seed_table(runs, fields)
  final = [5.0 - 40 / 40 - seed / 10 for seed in lengths]
  assert len(rows) == 1 and rows[0][:2] == ['500', '3']
  assert csv_rows[0]['final_val_loss_mean'] == pytest.approx(np.mean(final))
  assert csv_rows[0]['final_val_loss_std'] == pytest.approx(np.std(final, ddof=1))
  with pytest.raises(ValueError, match=r"--fields=depth is in no run's config.json"):
    results.load_runs(str(sweep_dir), compare=['depth'])


def test_curves_are_coloured_by_the_first_field_and_panelled_by_the_second():
  fields = ['model.norm_position', 'optim.warmup_steps', 'optim.learning_rate']
  assert plots.grouping(fields) == ('model.norm_position', 'optim.warmup_steps', ['optim.learning_rate'])
  assert plots.grouping(fields, colour_by='lr', panel_by='model.norm_position') == (
      'optim.learning_rate', 'model.norm_position', ['optim.warmup_steps'])
  assert plots.grouping([]) == (None, None, [])
  with pytest.raises(ValueError, match='--panel_by=depth is not a swept field; they are: norm_position, warmup'):
    plots.grouping(fields, panel_by='depth')


def test_report_command_line_errors_are_one_line(tmp_path):
  result = subprocess.run([sys.executable, '-m', 'scripts.report', str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert result.stderr.strip() == f'report.py: {tmp_path} holds no sweep.json and no run folder ' \
                                  '(config.json, status.json or metrics.jsonl)'


def test_runs_that_differ_only_in_seed_are_summarised_by_mean_and_sample_std(tmp_path):
  sweep_dir = tmp_path / 'sweep'
  losses = {('post', 0): 4.0, ('post', 1): 4.5, ('post', 2): None, ('pre', 0): 3.0, ('pre', 1): 3.2,
            ('pre', 2): 3.7}
  runs = []
  for (position, seed), loss in losses.items():
    name = f'norm_position={position},seed={seed}'
    if loss is None:  # diverged before its first validation
      fabricate_run(sweep_dir, name, position, 0, ('diverged', 10), train=[(10, 50.0, 100.0)])
    else:
      fabricate_run(sweep_dir, name, position, 0, ('finished', 20),
                    train=[(10, loss + 1, 100.0), (20, loss + 0.5, 100.0)], evals=[(20, loss, 10 * seed)])
    runs.append({'name': name, 'overrides': {'model.norm_position': position, 'train.seed': seed}})
  for run in runs:  # the seed is in config.json as train.py writes it
    config_path = sweep_dir / run['name'] / 'config.json'
    config = json.loads(config_path.read_text())
    config['train'] = {'seed': run['overrides']['train.seed']}
    config_path.write_text(json.dumps(config))
  (sweep_dir / sweeps.SWEEP_FILE).write_text(json.dumps({
      'config': 'configs/sweeps/x.py', 'extra_args': [], 'fields': ['model.norm_position', 'train.seed'],
      'runs': runs}))

  loaded, fields = results.load_runs(str(sweep_dir))
  assert [[run.name for run in group] for group in results.seed_groups(loaded, fields)] == [
      [run['name'] for run in runs[:3]], [run['name'] for run in runs[3:]]]
  header, rows, csv_rows = results.seed_table(loaded, fields)
  assert header[:5] == ['norm_position', 'seeds', 'states', 'final val loss', 'best val loss']
  # NumPy's sample standard deviation (ddof=1) is the reference.
  assert rows[0][:4] == ['post', '3', '2 finished, 1 diverged',
                         f'4.250 ± {np.std([4.0, 4.5], ddof=1):.3f} (n=2)']
  assert rows[1][3] == f'{np.mean([3.0, 3.2, 3.7]):.3f} ± {np.std([3.0, 3.2, 3.7], ddof=1):.3f}'
  assert csv_rows[1]['final_val_loss_n'] == 3
  assert csv_rows[1]['final_val_loss_std'] == pytest.approx(np.std([3.0, 3.2, 3.7], ddof=1))
  assert csv_rows[0]['final_bleu_mean'] == pytest.approx(5.0)  # seeds 0 and 1: BLEU 0 and 10

  out_dir = tmp_path / 'out'
  paths = report.write_report(str(sweep_dir), str(out_dir))
  assert 'report_seeds.csv' in [Path(path).name for path in paths]
  markdown = (out_dir / 'report.md').read_text()
  assert '## Over seeds: mean ± sample standard deviation' in markdown
  assert markdown.index('| post | 3 | 2 finished, 1 diverged |') < markdown.index('## Every run')
  assert (out_dir / 'val_loss.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_mean_curve_averages_the_seeds_present_at_each_step():
  steps, means, stds = plots._mean_curve(
      [[{'step': 10, 'x': 1.0}, {'step': 20, 'x': 3.0}], [{'step': 10, 'x': 2.0}]], 'x')
  assert steps == [10, 20] and means == [1.5, 3.0]
  assert stds[0] == pytest.approx(np.std([1.0, 2.0], ddof=1)) and stds[1] is None


def test_convergence_and_spikes_follow_their_stated_criteria():
  evals = [{'step': step, 'eval_loss': loss} for step, loss in
           ((1000, 3.0), (4000, 2.02), (8000, 2.005), (10000, 2.0))]
  # The last validation at or before step 8000 is 2.005: 0.25% change, converged by the 1% rule.
  assert results.last_fifth_change(evals) == pytest.approx(0.005 / 2.005)
  assert results.last_fifth_change(evals) < results.CONVERGED_CHANGE
  assert results.last_fifth_change(evals[:1]) is None
  train = [{'train_loss': loss} for loss in (7.0, 5.0, 4.0, 6.1, 5.0, 7.6, 7.0)]
  assert results.loss_spikes(train) == 2  # 4.0 -> 6.1 and 5.0 -> 7.6; 5.0 -> 7.5 would not be
