"""Sweep expansion (configs/sweeps/xiong2020.py), run plans, and scripts/sweep.py on the smoke config."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from model.transformer import Transformer
from training import command_line
from experiments import sweeps
from training.optimizer import make_optimizer

REPO = Path(__file__).resolve().parents[1]
XIONG = 'configs/sweeps/xiong2020.py'
# ml_collections' config_flags loads config files with importlib's deprecated load_module().
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
  """Config paths such as configs/sweeps/xiong2020.py are relative to the repository root."""
  monkeypatch.chdir(REPO)


def write_sweep(tmp_path, body, name='sweep_config.py'):
  path = tmp_path / name
  path.write_text('from configs import smoke\n\nget_config = smoke.get_config\n\n' + textwrap.dedent(body))
  return str(path)


@pytest.mark.parametrize('preset,count', [('warmup', 15), ('depth', 6), ('norm', 4), ('position', 4),
                                          ('warmup_cpu', 4), ('norm_cpu', 4), ('position_cpu', 4)])
def test_each_preset_expands_to_unique_named_runs_whose_configs_carry_the_overrides(preset, count, tmp_path):
  runs = sweeps.expand(f'{XIONG}:{preset}', str(tmp_path))
  assert len(runs) == count
  assert len({run.name for run in runs}) == count
  for run in runs:
    assert f'--workdir={tmp_path / run.name}' in run.args
    assert f'--config={XIONG}:{preset}' == run.args[0]
    for key, value in run.overrides.items():
      section, field = key.split('.')
      assert run.config[section][field] == value
    assert run.config.train.num_steps == {'warmup_cpu': 100, 'norm_cpu': 300,
                                          'position_cpu': 300}.get(preset, 500)
    make_optimizer(run.config.optim, steps_per_epoch=150, total_steps=run.config.train.num_steps)
  assert not os.path.exists(tmp_path / runs[0].name)  # expanding writes nothing


def test_warmup_preset_grid_names_and_depth():
  runs = {run.name: run for run in sweeps.expand(f'{XIONG}:warmup', 'runs/w')}
  adam = [name for name in runs if 'optimizer' not in name]
  assert len(adam) == 2 * 3 * 2
  assert 'norm_position=post,warmup=0,lr=0.0005' in runs
  sgd = runs['norm_position=post,warmup=4000,lr=0.1,optimizer=sgd'].config
  assert (sgd.optim.optimizer, sgd.optim.warmup_steps, sgd.model.norm_position) == ('sgd', 4000, 'post')
  assert all(run.config.model.num_encoder_layers == run.config.model.num_decoder_layers == 6
             for run in runs.values())
  assert all(run.config.optim.schedule == 'constant' for run in runs.values())
  depth = {run.name: run.config.model for run in sweeps.expand(f'{XIONG}:depth', 'runs/d')}
  assert depth['norm_position=pre,enc_layers=12,dec_layers=12'].num_decoder_layers == 12


@pytest.mark.parametrize('preset', ['warmup', 'depth'])
def test_preset_base_config_builds(preset):
  config = command_line.parse_config_args([f'--config={XIONG}:{preset}'])
  model = Transformer.of(config.model, config.data.vocab_size)
  tokens = jnp.ones((2, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, tokens))
  logits = jax.eval_shape(lambda v: model.apply(v, tokens, tokens), shapes)
  assert logits.shape == (2, 8, config.data.vocab_size)


def test_extra_arguments_apply_to_every_run_but_not_to_a_swept_field():
  runs = sweeps.expand(f'{XIONG}:norm', 'runs/n', ['--config.train.num_steps=2000'])
  assert all(run.config.train.num_steps == 2000 and run.args[-1] == '--config.train.num_steps=2000'
             for run in runs)
  with pytest.raises(ValueError, match='sweeps model.norm, so it cannot be set for every run'):
    sweeps.expand(f'{XIONG}:norm', 'runs/n', ['--config.model.norm=rms'])
  with pytest.raises(ValueError, match='model.nrom is not a config field'):
    sweeps.expand(f'{XIONG}:norm', 'runs/n', ['--config.model.nrom=rms'])


@pytest.mark.parametrize('body,message', [
    ("def sweep():\n  yield {'model.nrom': 'rms'}\n", 'model.nrom is not a config field'),
    ("def sweep():\n  yield {'model.norm': 'group'}\n", "config.model.norm='group' is not one of"),
    ("def sweep():\n  yield {'train.num_steps': 2.5}\n", "invalid literal for int()"),
    ("def sweep():\n  yield {'model.norm': 'rms'}\n  yield {'model.norm': 'rms'}\n",
     "two runs are named 'norm=rms'"),
    ("def sweep():\n  return []\n", 'sweep() gives no runs'),
    ('', 'defines no sweep(preset)'),
])
def test_bad_sweeps_fail_with_one_line_naming_the_problem(tmp_path, body, message):
  with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')) as error:
    sweeps.expand(write_sweep(tmp_path, body), str(tmp_path / 'w'))
  assert '\n' not in str(error.value)


def test_seeds_repeat_every_point_with_seeds_adjacent_and_named(tmp_path):
  spec = write_sweep(tmp_path, """
      def get_config(preset='a'):
        return smoke.get_config()

      def sweep(preset='a'):
        for norm in ('rms', 'layer'):
          yield {'model.norm': norm}

      def seeds(preset='a'):
        return {'a': 2, 'b': 1}[preset]
      """)
  runs = sweeps.expand(spec, 'w', seeds=3)
  assert [run.name for run in runs] == [f'norm={norm},seed={seed}' for norm in ('rms', 'layer')
                                        for seed in range(3)]
  assert [(run.config.model.norm, run.config.train.seed) for run in runs] == [
      (norm, seed) for norm in ('rms', 'layer') for seed in range(3)]
  # Without --seeds the config's seeds(preset) decides; one seed leaves names as they were.
  assert [run.name for run in sweeps.expand(spec + ':a', 'w')][:2] == ['norm=rms,seed=0', 'norm=rms,seed=1']
  assert [run.name for run in sweeps.expand(spec + ':b', 'w')] == ['norm=rms', 'norm=layer']
  with pytest.raises(ValueError, match='sweeps train.seed, so it cannot be set for every run'):
    sweeps.expand(spec, 'w', ['--config.train.seed=4'], seeds=2)
  with pytest.raises(ValueError, match='seeds=0 must be a positive integer'):
    sweeps.expand(spec, 'w', seeds=0)
  seeded = write_sweep(tmp_path, "def sweep():\n  yield {'train.seed': 5}\n", name='seeded.py')
  with pytest.raises(ValueError, match='sweeps train.seed itself'):
    sweeps.expand(seeded, 'w', seeds=2)


@pytest.mark.parametrize('spec,points,field', [
    ('configs/sweeps/depth_stability.py:cpu', 15, 'model.norm_position'),
    ('configs/sweeps/length_extrapolation.py:cpu', 5, 'model.position')])
def test_depth_and_length_sweeps_repeat_each_point_over_three_seeds(spec, points, field):
  runs = sweeps.expand(spec, 'runs/x')
  assert len(runs) == 3 * points
  assert [run.config.train.seed for run in runs[:3]] == [0, 1, 2]
  assert len({sweeps._lookup(run.config, field) for run in runs}) == 5  # placements; positions
  if 'depth' in spec:  # no warmup, a fixed rate, 6 to 24 layers per side
    assert {(run.config.optim.warmup_steps, run.config.optim.schedule) for run in runs} == {(0, 'constant')}
    assert {run.config.model.num_decoder_layers for run in runs} == {6, 12, 24}
  else:
    assert {run.config.data.train_max_source_words for run in runs} == {10}


def test_unknown_preset_names_the_valid_ones():
  with pytest.raises(ValueError, match="preset 'bogus' is not one of: warmup, depth, norm, position"):
    sweeps.expand(f'{XIONG}:bogus', 'runs/x')


def test_run_names_are_readable_and_filesystem_safe():
  labels = sweeps.field_labels(['model.norm_position', 'optim.learning_rate', 'data.source_dir',
                                'model.dropout_rate', 'optim.dropout_rate'])
  assert labels['optim.learning_rate'] == 'lr' and labels['data.source_dir'] == 'source_dir'
  assert labels['model.dropout_rate'] == 'model.dropout_rate'  # two fields would share the label
  name = sweeps.run_name({'model.norm_position': 'post', 'optim.learning_rate': 1e-4,
                          'data.source_dir': '/data/my files'}, labels)
  assert name == 'norm_position=post,lr=0.0001,source_dir=_data_my_files'


def write_status(run_dir, state, step):
  run_dir.mkdir(parents=True, exist_ok=True)
  (run_dir / 'status.json').write_text(json.dumps({'state': state, 'step': step}))


@pytest.mark.parametrize('state,step,rerun_diverged,expected', [
    ('finished', 500, False, 'skip'),
    ('finished', 300, False, 'resume'),  # num_steps raised since
    ('diverged', 40, False, 'skip'),
    ('diverged', 40, True, 'resume'),
    ('failed', 120, False, 'resume'),
    ('running', 120, False, 'resume'),  # killed
])
def test_plan_skips_finished_and_diverged_runs_and_resumes_the_rest(tmp_path, state, step, rerun_diverged,
                                                                     expected):
  config = command_line.parse_config_args([f'--config={XIONG}:norm'])
  write_status(tmp_path / 'run', state, step)
  assert sweeps.plan(str(tmp_path / 'run'), config, rerun_diverged=rerun_diverged) == expected


def test_plan_starts_new_runs_and_resumes_checkpointed_ones_without_status(tmp_path):
  config = command_line.parse_config_args([f'--config={XIONG}:norm'])
  assert sweeps.plan(str(tmp_path / 'new'), config, rerun_diverged=False) == 'start'
  (tmp_path / 'old' / 'checkpoints').mkdir(parents=True)
  assert sweeps.plan(str(tmp_path / 'old'), config, rerun_diverged=False) == 'resume'


def run_sweep_cli(*args):
  return subprocess.run([sys.executable, '-m', 'scripts.sweep', *args], cwd=REPO, capture_output=True,
                        text=True, timeout=300)


def test_dry_run_prints_one_quoted_train_command_per_run_and_writes_nothing(tmp_path):
  workdir = tmp_path / 'a b'
  result = run_sweep_cli(f'{XIONG}:warmup', f'--workdir={workdir}', '--dry_run', '--only=warmup=0,')
  assert result.returncode == 0, result.stderr
  commands = [shlex.split(line) for line in result.stdout.splitlines()]
  assert len(commands) == 5  # 2 placements x 2 rates with Adam, 1 with SGD
  assert commands[0] == ['python', 'train.py', f'--config={XIONG}:warmup',
                         f'--workdir={workdir}/norm_position=post,warmup=0,lr=0.0005',
                         '--config.model.norm_position=post', '--config.optim.warmup_steps=0',
                         '--config.optim.learning_rate=0.0005']
  assert not workdir.exists()
  result = run_sweep_cli(f'{XIONG}:bogus', f'--workdir={workdir}', '--dry_run')
  assert result.returncode != 0
  assert result.stderr.strip() == ("sweep.py: configs/sweeps/xiong2020.py preset 'bogus' is not one of: "
                                   'warmup, depth, norm, position, warmup_cpu, norm_cpu, position_cpu, '
                                   'converge, converge_key, converge_sgd')


def test_a_failing_run_is_reported_and_the_sweep_goes_on_to_exit_status_1(tmp_path):
  spec = write_sweep(tmp_path, f"""
      def get_config():
        config = smoke.get_config()
        config.data.cache_dir = {str(tmp_path / 'cache')!r}
        return config

      def sweep():
        for folder in ('/nonexistent/a', '/nonexistent/b'):
          yield {{'data.source_dir': folder}}
      """)
  result = run_sweep_cli(spec, f'--workdir={tmp_path / "sweep"}')
  assert result.returncode == 1
  lines = result.stdout.strip().splitlines()
  assert lines[1].startswith('[1/2] source_dir=_nonexistent_a: failed')
  assert lines[1].endswith('(exit status 1; see the log)')
  assert lines[3].startswith('[2/2] source_dir=_nonexistent_b: failed')
  assert lines[-1] == f'sweep {tmp_path / "sweep"}: 2 runs: 0 finished, 0 diverged, 2 failed'
  assert '/nonexistent/a' in (tmp_path / 'sweep' / 'source_dir=_nonexistent_a' / 'train.log').read_text()


def test_a_workdir_holds_one_sweep(tmp_path):
  runs = sweeps.expand(f'{XIONG}:norm', str(tmp_path))
  sweeps.write_sweep_json(str(tmp_path), f'./{XIONG}:norm', [], runs)
  with pytest.raises(ValueError, match=f'{tmp_path} holds the sweep of ./{XIONG}:norm, not {XIONG}:position'):
    sweeps.write_sweep_json(str(tmp_path), f'{XIONG}:position', [], runs)
  sweeps.write_sweep_json(str(tmp_path), f'{XIONG}:norm', ['--config.train.num_steps=9'], runs)
  assert sweeps.read_sweep_json(str(tmp_path))['extra_args'] == ['--config.train.num_steps=9']


def write_two_seed_sweep(tmp_path, data_cache):
  """Seeds 0 and 1 of the smoke model, 4 steps of packed rows, a checkpoint every 2."""
  return write_sweep(tmp_path, f"""
      def get_config():
        config = smoke.get_config()
        config.data.update(cache_dir={str(data_cache)!r}, eval_examples=8, pack_length=32)
        config.train.update(num_steps=4, log_every=2, eval_every=4, checkpoint_every=2)
        return config

      def sweep():  # seeds and packed rows share one compiled step, so the second run skips compiling
        for seed in (0, 1):
          yield {{'train.seed': seed}}
      """)


def test_sweep_trains_its_runs_then_skips_finished_ones_and_resumes_a_killed_one(tmp_path, data_cache):
  spec = write_two_seed_sweep(tmp_path, data_cache)
  workdir = tmp_path / 'sweep'
  result = run_sweep_cli(spec, f'--workdir={workdir}')
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.strip().splitlines()[-1] == f'sweep {workdir}: 2 runs: 2 finished, 0 diverged, 0 failed'
  sweep_json = json.loads((workdir / 'sweep.json').read_text())
  assert [run['overrides'] for run in sweep_json['runs']] == [{'train.seed': 0}, {'train.seed': 1}]
  first, second = workdir / 'seed=0', workdir / 'seed=1'
  first_files = {name: (first / name).read_text() for name in ('metrics.jsonl', 'train.log', 'status.json')}

  # seed=1 as if killed at step 3: its step-4 checkpoint never written, its status still 'running'.
  shutil.rmtree(second / 'checkpoints' / '4')
  write_status(second, 'running', 3)
  result = run_sweep_cli(spec, f'--workdir={workdir}')
  assert result.returncode == 0, result.stdout + result.stderr
  assert '[1/2] seed=0: finished at step 4, skipped' in result.stdout
  assert f'[2/2] seed=1: resume, log in {second}/train.log' in result.stdout
  assert {name: (first / name).read_text() for name in first_files} == first_files
  assert json.loads((second / 'status.json').read_text())['state'] == 'finished'
  train_steps = [json.loads(line)['step'] for line in open(second / 'metrics.jsonl') if 'train_loss' in line]
  # Step 4 trained again from the step-2 checkpoint, its first record dropped on resume.
  assert train_steps == [2, 4]
  assert sorted(os.listdir(second / 'checkpoints')) == ['2', '4']
  assert (second / 'train.log').read_text().count('# scripts/sweep.py') == 2


def test_together_groups_the_runs_that_differ_in_member_fields_and_hosts_split_by_group(tmp_path):
  # converge_key: Post-LN and Pre-LN x warmup {0, 4000} x 3 seeds. Warmup and seed enter the
  # compiled step as arguments, so each placement's 6 runs train as one program; hosts split the
  # sweep by those groups, never a group over two hosts.
  shares = [run_sweep_cli(f'{XIONG}:converge_key', f'--workdir={tmp_path}', '--together',
                          '--num_hosts=2', f'--host_index={host}', '--dry_run') for host in (0, 1)]
  commands = [[shlex.split(line) for line in share.stdout.splitlines()] for share in shares]
  assert [len(host) for host in commands] == [1, 1]
  for host, placement in zip(commands, ('post', 'pre')):
    [command] = host
    assert (f'--workdir={tmp_path}/norm_position={placement},warmup={{optim.warmup_steps}},'
            'seed={seed}') in command
    assert command[-2:] == ['--vary=optim.warmup_steps=0,0,0,4000,4000,4000',
                            '--vary=train.seed=0,1,2,0,1,2']
    assert f'--config.model.norm_position={placement}' in command
    assert not any(arg.startswith(('--config.optim.warmup_steps', '--config.train.seed'))
                   for arg in command)


def test_together_trains_a_points_seeds_in_one_process_each_in_its_own_folder(
    tmp_path, data_cache):
  spec = write_two_seed_sweep(tmp_path, data_cache)
  workdir = tmp_path / 'sweep'
  dry = run_sweep_cli(spec, f'--workdir={workdir}', '--together', '--dry_run')
  [command] = dry.stdout.strip().splitlines()
  assert f"'--workdir={workdir}/seed={{seed}}'" in command and command.endswith('--seeds=0,1')
  result = run_sweep_cli(spec, f'--workdir={workdir}', '--together')
  assert result.returncode == 0, result.stdout + result.stderr
  assert f'[2/2] seed=1: start (trained together), log in {workdir}/seed=0/train.log' in result.stdout
  assert result.stdout.strip().splitlines()[-1] == f'sweep {workdir}: 2 runs: 2 finished, 0 diverged, 0 failed'
  for seed in (0, 1):
    run_dir = workdir / f'seed={seed}'
    assert json.loads((run_dir / 'config.json').read_text())['train']['seed'] == seed
    assert json.loads((run_dir / 'status.json').read_text())['state'] == 'finished'
    assert sorted(os.listdir(run_dir / 'checkpoints')) == ['2', '4']
  assert 'seed 1: step 4: validation loss' in (workdir / 'seed=0' / 'train.log').read_text()
  again = run_sweep_cli(spec, f'--workdir={workdir}', '--together')
  assert '[2/2] seed=1: finished at step 4, skipped' in again.stdout


def test_together_trains_points_of_other_peak_rates_with_their_seeds_as_one_program(
    tmp_path, data_cache):
  """Two peak rates x two seeds of the smoke model: one train.py (--vary, zipped), four ordinary
  run folders named as the sweep names them, each with its own rate in its config and records."""
  spec = write_sweep(tmp_path, f"""
      def get_config():
        config = smoke.get_config()
        config.data.update(cache_dir={str(data_cache)!r}, eval_examples=8, pack_length=32)
        config.train.update(num_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
        return config

      def seeds():
        return 2

      def sweep():
        for rate in (3e-3, 1e-3):
          yield {{'optim.learning_rate': rate}}
      """)
  workdir = tmp_path / 'sweep'
  [command] = run_sweep_cli(spec, f'--workdir={workdir}', '--together', '--dry_run').stdout.splitlines()
  assert command.endswith(
      '--vary=optim.learning_rate=0.003,0.003,0.001,0.001 --vary=train.seed=0,1,0,1')
  result = run_sweep_cli(spec, f'--workdir={workdir}', '--together')
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count('start (trained together)') == 4
  for rate in (0.003, 0.001):
    for seed in (0, 1):
      run_dir = workdir / f'lr={rate},seed={seed}'
      config = json.loads((run_dir / 'config.json').read_text())
      assert (config['optim']['learning_rate'], config['train']['seed']) == (rate, seed)
      assert json.loads((run_dir / 'status.json').read_text())['state'] == 'finished'
      records = [json.loads(line) for line in (run_dir / 'metrics.jsonl').read_text().splitlines()]
      # The update that made step 2 (one before it) warms up over 10 steps: 1/10 of the peak.
      [second] = [r for r in records if r['step'] == 2 and 'learning_rate' in r]
      assert second['learning_rate'] == pytest.approx(rate / 10, rel=1e-6)
