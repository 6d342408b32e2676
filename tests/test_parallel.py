"""Data parallelism: a step sharded over 4 CPU devices, and two jax.distributed processes."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import portpicker
import pytest

from configs import smoke
from model.transformer import Transformer
from training import train_state
from training.checkpointing import Checkpointer
from training.optimizer import make_optimizer
from tests.sweep_fixtures import env_with_devices

REPO = Path(__file__).resolve().parents[1]


def test_sharded_train_step_equals_single_device_step():
  env = {**env_with_devices(4), 'PYTHONPATH': str(REPO)}
  result = subprocess.run([sys.executable, 'tests/sharded_step_check.py', 'layer', 'batch'], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  reports = [json.loads(line) for line in result.stdout.strip().splitlines()[-2:]]
  assert [report['norm'] for report in reports] == ['layer', 'batch']
  for report in reports:
    single, sharded = report['loss']
    assert sharded == pytest.approx(single, rel=1e-5)
    assert report['update_scale'] > 1e-3
    assert report['params_diff'] <= 1e-4 * report['update_scale']
    assert report['batch_stats_diff'] <= 1e-5


def _train_command(workdir, cache_dir, *extra):
  # One evaluation batch (eval_examples=8): what is compared is the trained params, and each
  # evaluation batch shape costs every process a compilation.
  return [sys.executable, 'train.py', '--config=configs/smoke.py', f'--workdir={workdir}',
          f'--config.data.cache_dir={cache_dir}', '--config.train.num_steps=6',
          '--config.train.checkpoint_every=6', '--config.train.eval_every=6',
          '--config.train.log_every=3', '--config.data.eval_examples=8', *extra]


def _final_params(workdir):
  """The latest checkpoint's params, restored onto this process's devices."""
  config = smoke.get_config()
  model = Transformer.of(config.model, config.data.vocab_size)
  tx, _ = make_optimizer(config.optim, steps_per_epoch=None, total_steps=config.train.num_steps)
  checkpointer = Checkpointer(str(workdir), keep=1, save_every=1)
  step = checkpointer.latest_step()
  state, _ = checkpointer.restore(step, train_state.create_train_state(model, tx, seed=0))
  checkpointer.close()
  return step, state.params


def test_two_processes_train_like_one_process_with_the_same_devices(tmp_path, data_cache):
  port = portpicker.pick_unused_port()
  processes = [subprocess.Popen(
      _train_command(tmp_path / 'two', data_cache, '--multiprocess', f'--coordinator_address=127.0.0.1:{port}',
                     '--num_processes=2', f'--process_id={i}'),
      cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = [p.communicate(timeout=400)[0] for p in processes]
  assert all(p.returncode == 0 for p in processes), outputs[0][-3000:] + outputs[1][-3000:]
  # One process with two local devices sees the same global batches (the plan depends on the device count).
  single = subprocess.run(_train_command(tmp_path / 'one', data_cache), cwd=REPO, capture_output=True, text=True,
                          env=env_with_devices(2), timeout=400)
  assert single.returncode == 0, single.stderr[-3000:]
  step_two, params_two = _final_params(tmp_path / 'two')
  step_one, params_one = _final_params(tmp_path / 'one')
  assert step_two == step_one == 6
  for a, b in zip(jax.tree.leaves(params_two), jax.tree.leaves(params_one)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  records = [json.loads(line) for line in open(tmp_path / 'two' / 'metrics.jsonl')]
  assert [r['step'] for r in records if 'train_loss' in r] == [3, 6]  # written once, by process 0
