"""Sweeps beyond one machine, simulated on this one: hosts splitting a sweep, a whole-slice sweep
over two jax.distributed processes, and the SLURM path through submitit's local executor."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import portpicker
import pytest
import submitit

from experiments import slurm, sweeps
from training import checkpointing, command_line, train_state
from training.optimizer import make_optimizer

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


def write_sweep(tmp_path, data_cache, *, norms, num_steps, checkpoint_every):
  path = tmp_path / 'sweep_config.py'
  path.write_text(textwrap.dedent(f"""
      from configs import smoke

      def get_config():
        config = smoke.get_config()
        config.data.update(cache_dir={str(data_cache)!r}, eval_examples=8)
        config.train.update(num_steps={num_steps}, log_every=2, eval_every={num_steps},
                            checkpoint_every={checkpoint_every})
        return config

      def sweep():
        for norm in {tuple(norms)!r}:
          yield {{'model.norm': norm}}
      """))
  return str(path)


def sweep_command(spec, workdir, *args):
  return [sys.executable, '-m', 'scripts.sweep', spec, f'--workdir={workdir}', *args]


def env_with_devices(count):
  return {**os.environ, 'CI': '1', 'XLA_FLAGS': f'--xla_force_host_platform_device_count={count}'}


def train_steps(run_dir):
  return [json.loads(line)['step'] for line in open(run_dir / 'metrics.jsonl') if 'train_loss' in line]


def status(run_dir):
  return json.loads((run_dir / 'status.json').read_text())


def wait_for_training(run_dir, process, timeout=240):
  """Returns once `run_dir` has a logged training step (the run is mid-way)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if (run_dir / 'metrics.jsonl').exists() and train_steps(run_dir):
      return
    assert process.poll() is None, f'{process.args} ended early with {process.returncode}'
    time.sleep(0.05)
  raise AssertionError(f'{run_dir} did not start training in {timeout} s')


def lock_holder(run_dir):
  """The pid of the train.py training `run_dir` ('pid N on HOST since ...' in run.lock)."""
  return int((run_dir / 'run.lock').read_text().split()[1])


def final_params(run_dir, spec, name):
  config = command_line.parse_config_args([f'--config={spec}', f'--config.model.norm={name}'])
  model = train_state.build_model(config, config.data.vocab_size)
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
  spec = write_sweep(tmp_path, data_cache, norms=('layer', 'rms', 'scale'), num_steps=40,
                     checkpoint_every=4)
  workdir = tmp_path / 'sweep'
  hosts = [subprocess.Popen(sweep_command(spec, workdir, '--num_hosts=2', f'--host_index={i}'),
                            cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  # Host 1 owns norm=rms alone; kill its sweep outright mid-run (its train.py saves on the way out).
  wait_for_training(workdir / 'norm=rms', hosts[1])
  train_pid = lock_holder(workdir / 'norm=rms')
  hosts[1].kill()
  hosts[1].wait()
  # Its train.py, sent SIGTERM by the kernel, saves and ends; restart after that, as a preempted
  # VM restarts with nothing of the old host left (a train.py still saving would hold its lock).
  deadline = time.monotonic() + 120
  while Path(f'/proc/{train_pid}').exists() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert status(workdir / 'norm=rms')['state'] == 'stopped'
  restarted = subprocess.run(sweep_command(spec, workdir, '--num_hosts=2', '--host_index=1'), cwd=REPO,
                             env=env_with_devices(1), capture_output=True, text=True, timeout=400)
  host0 = hosts[0].communicate(timeout=400)[0]
  assert hosts[0].returncode == 0 and restarted.returncode == 0, host0 + restarted.stdout + restarted.stderr
  assert '[1/2] norm=layer: start' in host0 and '[2/2] norm=scale: start' in host0
  assert 'norm=rms' not in host0
  assert '[1/1] norm=rms: resume' in restarted.stdout
  assert restarted.stdout.strip().splitlines()[-1] == (
      f'sweep {workdir} (host 1 of 2): 1 runs: 1 finished, 0 diverged, 0 failed')
  for name, invocations in (('layer', 1), ('rms', 2), ('scale', 1)):
    run_dir = workdir / f'norm={name}'
    assert status(run_dir) == {**status(run_dir), 'state': 'finished', 'step': 40}
    assert (run_dir / 'train.log').read_text().count('# scripts/sweep.py') == invocations
    steps = train_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 40  # each step once, in order
  assert json.loads((workdir / 'sweep.json').read_text())['fields'] == ['model.norm']


def test_whole_slice_sweep_on_two_processes_equals_one_process_with_the_same_devices(tmp_path, data_cache):
  spec = write_sweep(tmp_path, data_cache, norms=('layer', 'rms'), num_steps=4, checkpoint_every=4)
  port = portpicker.pick_unused_port()
  command = lambda i: sweep_command(spec, tmp_path / 'slice', '--multiprocess', f'--process_id={i}',
                                    f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2')
  processes = [subprocess.Popen(command(i), cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [process.communicate(timeout=400)[0] for process in processes]
  assert all(process.returncode == 0 for process in processes), outputs[0][-3000:] + outputs[1][-3000:]
  assert '[1/2] norm=layer: start on 2 processes, 2 devices' in outputs[0]
  assert '[1/2]' not in outputs[1]  # only process 0 speaks
  # The same sweep on one process holding both devices, one train.py per run.
  single = subprocess.run(sweep_command(spec, tmp_path / 'one'), cwd=REPO, env=env_with_devices(2),
                          capture_output=True, text=True, timeout=400)
  assert single.returncode == 0, single.stdout + single.stderr
  for name in ('layer', 'rms'):
    step_slice, params_slice = final_params(tmp_path / 'slice' / f'norm={name}', spec, name)
    step_one, params_one = final_params(tmp_path / 'one' / f'norm={name}', spec, name)
    assert step_slice == step_one == 4
    for a, b in zip(jax.tree.leaves(params_slice), jax.tree.leaves(params_one)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert train_steps(tmp_path / 'slice' / f'norm={name}') == [2, 4]  # written once, by process 0
  # Run again: both processes take process 0's decision and skip both runs.
  port = portpicker.pick_unused_port()
  processes = [subprocess.Popen(command(i), cwd=REPO, env=env_with_devices(1), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [process.communicate(timeout=400)[0] for process in processes]
  assert all(process.returncode == 0 for process in processes), outputs[0][-3000:] + outputs[1][-3000:]
  assert '[1/2] norm=layer: finished at step 4, skipped' in outputs[0]
  assert '[2/2] norm=rms: finished at step 4, skipped' in outputs[0]


def test_slurm_job_requeued_by_submitit_saves_and_resumes_its_run(tmp_path, data_cache, monkeypatch):
  monkeypatch.chdir(REPO)  # submitit's job imports experiments.slurm from its working directory
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  spec = write_sweep(tmp_path, data_cache, norms=('layer',), num_steps=40, checkpoint_every=4)
  [run] = sweeps.expand(spec, str(tmp_path / 'sweep'))
  run_dir = tmp_path / 'sweep' / run.name
  executor = submitit.LocalExecutor(folder=tmp_path / 'submitit')
  executor.update_parameters(timeout_min=10)
  [job] = slurm.submit([run], str(tmp_path / 'sweep'), executor, rerun_diverged=False)
  wait_for_training(run_dir, job._process)  # pylint: disable=protected-access
  # What SLURM does before a time limit or preemption: USR2 to the job's task, which is the
  # parent of train.py (run.lock names train.py's pid).
  train_pid = lock_holder(run_dir)
  task_pid = int(Path(f'/proc/{train_pid}/stat').read_text().split(')')[1].split()[1])
  os.kill(task_pid, signal.SIGUSR2)
  assert job.result() == 'finished'
  assert status(run_dir)['step'] == 40
  assert 'stopped by SIGTERM at step' in job.stderr()
  steps = train_steps(run_dir)
  assert steps == sorted(set(steps)) and steps[-1] == 40
  # Submitted again, the finished run's job returns at once without training.
  [again] = slurm.submit([run], str(tmp_path / 'sweep'), executor, rerun_diverged=False)
  assert again.result() == 'finished'
  assert train_steps(run_dir) == steps


def test_slurm_launcher_submits_the_unfinished_runs_as_one_job_array(tmp_path, data_cache):
  # Stand-ins for SLURM's commands: sbatch keeps the script it was given and answers as SLURM does.
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'sbatch').write_text(f'#!/bin/sh\ncp "$1" {tmp_path / "job.sh"}\necho "Submitted batch job 4242"\n')
  (bin_dir / 'srun').write_text('#!/bin/sh\nexit 0\n')
  for tool in ('sbatch', 'srun'):
    (bin_dir / tool).chmod(0o755)
  spec = write_sweep(tmp_path, data_cache, norms=('layer', 'rms', 'scale'), num_steps=40,
                     checkpoint_every=4)
  workdir = tmp_path / 'sweep'
  (workdir / 'norm=rms').mkdir(parents=True)
  (workdir / 'norm=rms' / 'status.json').write_text(json.dumps({'state': 'finished', 'step': 40}))
  result = subprocess.run(
      sweep_command(spec, workdir, '--launcher=slurm', '--slurm_partition=gpu', '--slurm_nodes=2',
                    '--slurm_gpus_per_node=4', '--slurm_time_min=120'),
      cwd=REPO, env={**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}'}, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  assert '[2/3] norm=rms: finished, not submitted' in result.stdout
  assert 'norm=layer: submitted as job 4242_0' in result.stdout
  assert 'norm=scale: submitted as job 4242_1' in result.stdout
  script = (tmp_path / 'job.sh').read_text()
  for line in ('--array=0-1%2', '--partition=gpu', '--nodes=2', '--ntasks-per-node=1',
               '--gpus-per-node=4', '--time=120', '--signal=USR2@90'):
    assert f'#SBATCH {line}\n' in script
  assert json.loads((workdir / 'sweep.json').read_text())['config'] == spec
  # Without SLURM's commands: one line saying so, before anything is submitted.
  result = subprocess.run(sweep_command(spec, workdir, '--launcher=slurm'), cwd=REPO,
                          env={**os.environ, 'PATH': '/usr/bin:/bin'}, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip() == ('sweep.py: --launcher=slurm: Could not detect "srun", are you '
                                   'indeed on a slurm cluster?')
