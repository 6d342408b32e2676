"""What a run does under hostile conditions: a second process, damaged checkpoints, a changed
config or data, SIGTERM, an exploding loss, a killed sweep."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import partitioning, run_dir, run_log, stop_signals, train_state, trainer
from evaluation import trained_model
from training.checkpointing import CheckpointError
from tests.test_sweep import write_sweep
from tests.sweep_fixtures import env_with_devices
from tests.test_train import (assert_same_records, params_equal_bitwise, read_jsonl, run_train_cli,
                              smoke_config)

REPO = Path(__file__).resolve().parents[1]


def _config(data_cache, **train_overrides):
  return smoke_config(data_cache, **{'num_steps': 20, 'log_every': 5, 'eval_every': 10,
                                     'checkpoint_every': 10, **train_overrides})


@pytest.fixture(scope='module')
def reference_run(tmp_path_factory, data_cache):
  """An uninterrupted 20-step run: checkpoints at 10 and 20."""
  workdir = tmp_path_factory.mktemp('reference')
  config = _config(data_cache)
  return workdir, config, trainer.train_and_evaluate(config, str(workdir))


def _truncate_array_files(checkpoint: Path) -> None:
  """Cuts every array data file of `checkpoint` to half its length, so that whatever a reader
  restores (eval.py reads the parameters alone, a resume everything) is damaged."""
  for path in (checkpoint / 'state').rglob('*'):
    if path.is_file() and '/d/' in str(path):
      path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _hold_lock(workdir: Path) -> subprocess.Popen:
  """Another process holding the run's lock until killed."""
  holder = subprocess.Popen(
      [sys.executable, '-c', textwrap.dedent(f"""
          import sys, time
          from training import run_dir
          lock = run_dir.RunLock({str(workdir)!r})
          lock.acquire()
          print('locked', flush=True)
          time.sleep(600)
          """)], cwd=REPO, stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == 'locked'
  return holder


def test_a_second_process_is_refused_with_the_holder_named_and_a_dead_holders_lock_is_taken_over(
    tmp_path, data_cache):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = _hold_lock(workdir)
  try:
    result = run_train_cli(f'--workdir={workdir}', '--config=configs/smoke.py',
                           f'--config.data.cache_dir={data_cache}')
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f'{workdir} is being trained by pid {holder.pid} on ') and 'run.lock' in line
    assert not (workdir / 'config.json').exists() and not (workdir / 'checkpoints').exists()
  finally:
    holder.kill()
    holder.wait()
  # kill -9 left the lock file behind; the kernel released the lock with the process.
  assert f'pid {holder.pid}' in (workdir / 'run.lock').read_text()
  lock = run_dir.RunLock(str(workdir))
  lock.acquire()
  assert f'pid {os.getpid()}' in (workdir / 'run.lock').read_text()
  with pytest.raises(run_dir.RunFolderError, match=f'being trained by pid {os.getpid()}'):
    run_dir.RunLock(str(workdir)).acquire()
  lock.release()


def test_incompatible_resume_is_refused_in_one_line_and_config_json_is_untouched(tmp_path, data_cache):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  run_dir.write_config(str(workdir), _config(data_cache))
  before = (workdir / 'config.json').read_bytes()
  changed = _config(data_cache)
  changed.model.d_model = 64
  changed.data.vocab_size = 2000
  with pytest.raises(run_dir.RunFolderError) as error:
    trainer.train_and_evaluate(changed, str(workdir))
  message = str(error.value)
  assert '\n' not in message
  assert 'data.vocab_size: 1000 in the run, 2000 now' in message
  assert 'model.d_model: 32 in the run, 64 now' in message
  assert (workdir / 'config.json').read_bytes() == before
  assert sorted(os.listdir(workdir)) == ['config.json', 'run.lock']
  # Fields a resumed run may change are accepted, and reported back.
  longer = _config(data_cache, num_steps=40, eval_every=5)
  assert run_dir.check_resume(str(workdir), longer) == {
      'train.eval_every': (10, 5), 'train.num_steps': (20, 40)}


def test_resume_on_changed_raw_files_is_refused(tmp_path):
  run_dir.write_source(str(tmp_path), 'aaaaaaaaaaaa')
  run_dir.check_source(str(tmp_path), 'aaaaaaaaaaaa')
  with pytest.raises(run_dir.RunFolderError, match='raw data files of .* changed since the run started'):
    run_dir.check_source(str(tmp_path), 'bbbbbbbbbbbb')


def test_a_run_with_the_older_fingerprint_is_told_how_to_resume(tmp_path):
  """source.json of before content fingerprints: a mismatch may be a mere copy of the same files."""
  (tmp_path / 'source.json').write_text(json.dumps({'fingerprint': 'aaaaaaaaaaaa'}))
  run_dir.check_source(str(tmp_path), 'aaaaaaaaaaaa')
  with pytest.raises(run_dir.RunFolderError, match='older fingerprint .* delete that file to resume'):
    run_dir.check_source(str(tmp_path), 'bbbbbbbbbbbb')
  (tmp_path / 'source.json').unlink()
  run_dir.check_source(str(tmp_path), 'bbbbbbbbbbbb')


# orbax's abandoned reads of the damaged files are reported by Python at garbage collection.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(reference_run, tmp_path, capsys):
  reference_dir, config, uninterrupted = reference_run
  workdir = tmp_path / 'damaged'
  shutil.copytree(reference_dir, workdir)
  _truncate_array_files(workdir / 'checkpoints' / '20')

  # eval.py --checkpoint=last: one line on stderr, then the step-10 checkpoint.
  mesh = partitioning.make_mesh()
  restored = trained_model.restore(str(workdir), None, 'last', mesh)
  assert restored.steps == [10]
  lines = [line for line in capsys.readouterr().err.splitlines() if 'next older checkpoint' in line]
  assert len(lines) == 1 and lines[0].startswith(f'checkpoint {workdir}/checkpoints/20 cannot be '
                                                 'restored (ValueError: OUT_OF_RANGE')
  # Asked for that exact step: refused, naming the others.
  with pytest.raises(ValueError, match=r'checkpoints/20 cannot be restored .*; other saved steps: 10$'):
    trained_model.restore(str(workdir), None, '20', mesh)

  # train.py resumes from step 10, sets step 20 aside and redoes it exactly.
  (workdir / 'status.json').unlink()
  resumed = trainer.train_and_evaluate(config, str(workdir))
  assert params_equal_bitwise(resumed.params, uninterrupted.params)
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['10', '20']
  assert os.listdir(workdir / 'damaged_checkpoints') == ['20']

  # Every checkpoint damaged: refused in one line rather than silently starting over.
  for step in ('10', '20'):
    _truncate_array_files(workdir / 'checkpoints' / step)
  with pytest.raises(CheckpointError, match=r'no checkpoint in .* can be restored \(steps 20, 10 are damaged\)'):
    trainer.train_and_evaluate(config, str(workdir))


def test_sigterm_saves_marks_the_run_stopped_and_resume_equals_the_uninterrupted_run(
    reference_run, tmp_path, monkeypatch):
  uninterrupted_dir, config, uninterrupted = reference_run
  workdir = tmp_path / 'stopped'
  requested = stop_signals.StopSignals.requested

  def signal_at_step_13(self, step):
    if step == 13:  # a real SIGTERM, to the handler train.py installed
      signal.raise_signal(signal.SIGTERM)
    return requested(self, step)

  monkeypatch.setattr(stop_signals.StopSignals, 'requested', signal_at_step_13)
  handler_before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(stop_signals.RunStopped) as stopped:
    trainer.train_and_evaluate(config, str(workdir))
  assert stopped.value.exit_code == 128 + signal.SIGTERM and stopped.value.step == 13
  status = json.loads((workdir / 'status.json').read_text())
  assert status['state'] == 'stopped' and status['step'] == 13
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['10', '13']
  # The handlers are train.py's only while it trains.
  assert signal.getsignal(signal.SIGTERM) is handler_before
  monkeypatch.setattr(stop_signals.StopSignals, 'requested', requested)

  resumed = trainer.train_and_evaluate(config, str(workdir))
  assert params_equal_bitwise(resumed.params, uninterrupted.params)
  assert params_equal_bitwise(resumed.opt_state, uninterrupted.opt_state)
  # Stopped inside the window of steps 11-15: the resumed run's step-15 record still covers all five.
  assert_same_records(workdir, uninterrupted_dir)


def test_an_exploding_finite_loss_stops_the_run_as_diverged(tmp_path, data_cache):
  config = _config(data_cache, num_steps=30, log_every=2, eval_every=100, checkpoint_every=100)
  # The hostile-user report's setting: loss 7.4 -> 2.7e9 over a run that ended 'finished'.
  config.optim.update(learning_rate=1e4, warmup_steps=0, schedule='constant')
  workdir = tmp_path / 'exploding'
  with pytest.raises(run_log.DivergenceError, match='above config.train.divergence_loss_ceiling=100') as error:
    trainer.train_and_evaluate(config, str(workdir))
  status = json.loads((workdir / 'status.json').read_text())
  assert status['state'] == 'diverged' and status['step'] == error.value.step
  losses = [record['train_loss'] for record in read_jsonl(workdir / 'metrics.jsonl') if 'train_loss' in record]
  assert np.isfinite(losses[-1]) and losses[-1] > 100


def test_the_device_metrics_window_sums_steps_and_keeps_the_first_non_finite_one():
  steps = [(2.0, 1.0, 10.0), (4.0, float('nan'), 20.0), (float('inf'), 3.0, 30.0), (6.0, 2.0, 40.0)]
  window = train_state.empty_metrics_window()
  for step, (loss, grad_norm, tokens) in enumerate(steps, start=101):
    metrics = {'train_loss': jnp.float32(loss), 'train_nll': jnp.float32(loss / 2),
               'grad_norm': jnp.float32(grad_norm), 'target_tokens': jnp.float32(tokens)}
    window = jax.jit(train_state.accumulate_metrics)(window, metrics, jnp.int32(step))
  assert int(window['steps']) == 4 and float(window['target_tokens']) == 100.0
  assert float(window['grad_norm']) == 2.0  # the latest step's
  assert int(window['nonfinite_step']) == 102
  assert float(window['nonfinite_loss']) == 4.0 and np.isnan(window['nonfinite_grad_norm'])
  clean = train_state.empty_metrics_window()
  for loss in (2.0, 4.0):
    clean = train_state.accumulate_metrics(clean, {'train_loss': jnp.float32(loss), 'train_nll': jnp.float32(1.0),
                                                   'grad_norm': jnp.float32(1.0), 'target_tokens': jnp.float32(1.0)},
                                           jnp.int32(1))
  assert float(clean['train_loss'] / clean['steps']) == 3.0 and int(clean['nonfinite_step']) == 0


def test_loss_watch_by_ceiling_and_by_growth_over_the_lowest():
  watch = run_log.LossWatch(ceiling=100.0, growth=5.0)
  for step, loss in enumerate([9.0, 6.0, 4.0, 19.9, 3.0]):
    watch.check(step, loss)  # 19.9 < 5 x 4.0
  with pytest.raises(run_log.DivergenceError, match='5.33x its lowest, 3'):
    watch.check(5, 16.0)
  with pytest.raises(run_log.DivergenceError, match='above config.train.divergence_loss_ceiling=100'):
    run_log.LossWatch(ceiling=100.0, growth=0.0).check(1, 150.0)
  run_log.LossWatch(ceiling=0.0, growth=0.0).check(1, 1e9)  # both off


@pytest.mark.parametrize('override,expected', [
    ('optim.optimizer=adamx', "config.optim.optimizer='adamx' is not one of: adam, adamw, sgd"),
    ('optim.warmup_steps=-10', 'config.optim.warmup_steps=-10 must be an integer >= 0'),
    ('optim.clip_norm=-1.0', 'config.optim.clip_norm=-1.0 must be >= 0'),
    ('data.source_lang=fr', "source_lang/target_lang ('fr', 'en') must be the two languages"),
    ('data.eval_split=tst', "Unknown multi30k split 'tst'; valid: train, validation"),
    ('train.divergence_growth=0.5', 'config.train.divergence_growth=0.5 must be above 1'),
    ('train.log_every=0', 'config.train.log_every=0 must be'),
    ('train.save_on_stop_after=-1', 'config.train.save_on_stop_after=-1 must be'),
    ('data.dataset_config=tokenised', "Unknown multi30k dataset_config 'tokenised'; valid: original, tokenized"),
    ('data.vocab_type=wordpiece', "config.data.vocab_type='wordpiece' is not one of: unigram, bpe"),
    ('data.eval_examples=-1', 'config.data.eval_examples=-1 must be an integer >= 0'),
    ('train.loss_chunk_tokens=-8', 'config.train.loss_chunk_tokens=-8 must be an integer >= 0'),
    ('train.time_budget_minutes=-5', 'config.train.time_budget_minutes=-5.0 must be a number of minutes >= 0'),
    # The smoke config warms up for 10 steps: too few to time before planning.
    ('train.time_budget_minutes=60', 'config.train.time_budget_minutes=60.0 needs config.optim.warmup_steps >= 20'),
])
def test_bad_fields_are_refused_before_anything_is_written(tmp_path, data_cache, override, expected):
  config = _config(data_cache)
  section, assignment = override.split('.', 1)
  name, value = assignment.split('=')
  config[section][name] = type(config[section][name])(value)
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=expected.replace('(', r'\(').replace(')', r'\)')):
    trainer.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_an_unknown_preset_is_one_short_line(tmp_path):
  result = run_train_cli(f'--workdir={tmp_path}/run', '--config=configs/multi30k.py:xx')
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      'invalid command line: flag --config=configs/multi30k.py:xx: Error whilst parsing config file: '
      "ValueError: configs/multi30k.py preset 'xx' is not one of: de_en, en_de, de_en_small")
  assert not (tmp_path / 'run').exists()


def _wait_for_train_record(metrics: Path, step: int, timeout: float = 240.0) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if metrics.exists() and any(json.loads(line)['step'] >= step for line in metrics.read_text().splitlines()
                                if line.endswith('}')):
      return
    time.sleep(0.2)
  raise AssertionError(f'{metrics} never reached step {step}')


def test_a_stopped_or_killed_sweep_leaves_no_run_training_and_resumes_each_run_once(tmp_path, data_cache):
  spec = write_sweep(tmp_path, f"""
      def get_config():
        config = smoke.get_config()
        config.data.update(cache_dir={str(data_cache)!r}, eval_examples=8)
        config.train.update(num_steps=400, log_every=2, eval_every=1000, checkpoint_every=1000)
        return config

      def sweep():
        yield {{'model.norm': 'rms'}}
      """)
  workdir = tmp_path / 'sweep'
  run = workdir / 'norm=rms'
  command = [sys.executable, '-m', 'scripts.sweep', spec, f'--workdir={workdir}']

  def start_and_wait(step):
    sweep = subprocess.Popen(command, cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    _wait_for_train_record(run / 'metrics.jsonl', step)
    return sweep

  def child_is_gone():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      if json.loads((run / 'status.json').read_text())['state'] == 'stopped':
        return json.loads((run / 'status.json').read_text())['step']
      time.sleep(0.2)
    raise AssertionError('train.py did not stop')

  # SIGTERM to the sweep: passed on to train.py, which saves and stops; then the sweep stops.
  sweep = start_and_wait(4)
  sweep.send_signal(signal.SIGTERM)
  output, _ = sweep.communicate(timeout=120)
  assert sweep.returncode == 128 + signal.SIGTERM, output
  assert 'stopped by SIGTERM during run 1 of 1 (norm=rms, stopped)' in output.strip().splitlines()[-1]
  first_stop = child_is_gone()
  assert str(first_stop) in os.listdir(run / 'checkpoints')

  # kill -9 of the sweep: its train.py gets SIGTERM from the kernel (parent-death signal) and stops.
  sweep = start_and_wait(first_stop + 4)
  sweep.kill()
  sweep.communicate(timeout=60)
  second_stop = child_is_gone()
  assert second_stop > first_stop
  # status.json says 'stopped' just before train.py releases the lock and exits: the lock must
  # come free, i.e. nothing is left training the run.
  lock, deadline = run_dir.RunLock(str(run)), time.monotonic() + 60
  while True:
    try:
      lock.acquire()
      break
    except run_dir.RunFolderError:
      assert time.monotonic() < deadline, 'the orphaned train.py never exited'
      time.sleep(0.2)
  lock.release()

  # The re-run finishes it; every step was trained by one process, in order, once.
  final = second_stop + 6 + second_stop % 2
  result = subprocess.run([*command, f'--config.train.num_steps={final}'], cwd=REPO, env=env_with_devices(1),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  steps = [record['step'] for record in read_jsonl(run / 'metrics.jsonl') if 'train_loss' in record]
  assert steps == list(range(2, final + 1, 2))
