"""Sweeps beyond one machine, simulated on this one: hosts splitting a sweep and a whole-slice
sweep over two jax.distributed processes. The SLURM path is tests/test_slurm.py."""

import json
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import portpicker
import pytest

from experiments import sweeps
from tests.sweep_fixtures import (env_with_devices, lock_holder, status, sweep_command, train_steps,
                                  wait_for_training, write_sweep)
from model.transformer import Transformer
from training import checkpointing, command_line, train_state
from training.optimizer import make_optimizer

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


def final_params(run_dir, spec):
  config = command_line.parse_config_args([f'--config={spec}'])
  model = Transformer.of(config.model, config.data.vocab_size)
  tx, _ = make_optimizer(config.optim, steps_per_epoch=None, total_steps=config.train.num_steps)
  checkpointer = checkpointing.Checkpointer(str(run_dir), keep=1, save_every=1)
  step = checkpointer.latest_step()
  state, _ = checkpointer.restore(step, train_state.create_train_state(model, tx, seed=0))
  checkpointer.close()
  return step, state.params


def test_hosts_split_runs_so_that_each_run_belongs_to_exactly_one_host():
  runs = [sweeps.Run(str(i), {}, (), None) for i in range(7)]
  shares = [sweeps.host_share(runs, 3, host) for host in range(3)]
  assert [[run.name for run in share] for share in shares] == [['0', '3', '6'], ['1', '4'], ['2', '5']]
  with pytest.raises(ValueError, match=r'--host_index=3 must be in \[0, --num_hosts=3\)'):
    sweeps.host_share(runs, 3, 3)


def test_two_hosts_split_a_sweep_and_a_killed_host_resumes_its_own_run_once(tmp_path, data_cache):
  spec = write_sweep(tmp_path, data_cache, seeds=(0, 1), num_steps=24, checkpoint_every=4)
  workdir = tmp_path / 'sweep'
  hosts = [subprocess.Popen(sweep_command(spec, workdir, '--num_hosts=2', f'--host_index={i}'),
                            cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  # Host 1 owns seed=1 alone; kill its sweep outright mid-run (its train.py saves on the way out).
  wait_for_training(workdir / 'seed=1', hosts[1])
  train_pid = lock_holder(workdir / 'seed=1')
  hosts[1].kill()
  hosts[1].wait()
  # Its train.py, sent SIGTERM by the kernel, saves and ends; restart after that, as a preempted
  # VM restarts with nothing of the old host left (a train.py still saving would hold its lock).
  deadline = time.monotonic() + 120
  while Path(f'/proc/{train_pid}').exists() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert status(workdir / 'seed=1')['state'] == 'stopped'
  restarted = subprocess.run(sweep_command(spec, workdir, '--num_hosts=2', '--host_index=1'), cwd=REPO,
                             env=env_with_devices(1), capture_output=True, text=True, timeout=400)
  host0 = hosts[0].communicate(timeout=400)[0]
  assert hosts[0].returncode == 0 and restarted.returncode == 0, host0 + restarted.stdout + restarted.stderr
  assert '[1/1] seed=0: start' in host0 and 'seed=1' not in host0
  assert '[1/1] seed=1: resume' in restarted.stdout
  assert restarted.stdout.strip().splitlines()[-1] == (
      f'sweep {workdir} (host 1 of 2): 1 runs: 1 finished, 0 diverged, 0 failed')
  for seed, invocations in ((0, 1), (1, 2)):
    run_dir = workdir / f'seed={seed}'
    assert status(run_dir) == {**status(run_dir), 'state': 'finished', 'step': 24}
    assert (run_dir / 'train.log').read_text().count('# scripts/sweep.py') == invocations
    steps = train_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 24  # each step once, in order
  assert json.loads((workdir / 'sweep.json').read_text())['fields'] == ['train.seed']


def test_whole_slice_sweep_on_two_processes_equals_one_process_with_the_same_devices(tmp_path, data_cache):
  spec = write_sweep(tmp_path, data_cache, seeds=(0, 1), num_steps=4, checkpoint_every=4,
                     pack_length=32)
  port = portpicker.pick_unused_port()
  command = lambda i: sweep_command(spec, tmp_path / 'slice', '--multiprocess', f'--process_id={i}',
                                    f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2')
  processes = [subprocess.Popen(command(i), cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [process.communicate(timeout=400)[0] for process in processes]
  assert all(process.returncode == 0 for process in processes), outputs[0][-3000:] + outputs[1][-3000:]
  assert '[1/2] seed=0: start on 2 processes, 2 devices' in outputs[0]
  assert '[1/2]' not in outputs[1]  # only process 0 speaks
  # The second run, which trained after the first in the same two processes, on one process
  # holding both devices, in a train.py of its own: nothing of the first run carried over.
  single = subprocess.run(sweep_command(spec, tmp_path / 'one', '--only=seed=1'), cwd=REPO,
                          env=env_with_devices(2), capture_output=True, text=True, timeout=400)
  assert single.returncode == 0, single.stdout + single.stderr
  step_one, params_one = final_params(tmp_path / 'one' / 'seed=1', spec)
  final = {}
  for name in ('seed=0', 'seed=1'):
    step_slice, final[name] = final_params(tmp_path / 'slice' / name, spec)
    assert step_slice == 4
    assert status(tmp_path / 'slice' / name)['state'] == 'finished'
    assert train_steps(tmp_path / 'slice' / name) == [2, 4]  # written once, by process 0
  assert step_one == 4
  for a, b in zip(jax.tree.leaves(final['seed=1']), jax.tree.leaves(params_one)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Each run trained with its own seed: the second is not a copy of the first.
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(final['seed=0']),
                                                  jax.tree.leaves(final['seed=1'])))
  # Run again: both processes take process 0's decision and skip both runs.
  port = portpicker.pick_unused_port()
  processes = [subprocess.Popen(command(i), cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [process.communicate(timeout=400)[0] for process in processes]
  assert all(process.returncode == 0 for process in processes), outputs[0][-3000:] + outputs[1][-3000:]
  assert '[1/2] seed=0: finished at step 4, skipped' in outputs[0]
  assert '[2/2] seed=1: finished at step 4, skipped' in outputs[0]
