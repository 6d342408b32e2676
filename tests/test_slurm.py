"""The SLURM path of scripts/sweep.py: submitit jobs requeued on SLURM's USR2 (through submitit's
local executor), and the job array --launcher=slurm submits (against stand-in sbatch and srun)."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import submitit

from experiments import slurm, sweeps
from tests.sweep_fixtures import (lock_holder, status, sweep_command, train_steps, wait_for_training,
                                  write_sweep, xla_flags)

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


def test_slurm_job_requeued_by_submitit_saves_and_resumes_its_run(tmp_path, data_cache, monkeypatch):
  monkeypatch.chdir(REPO)  # submitit's job imports experiments.slurm from its working directory
  monkeypatch.setenv('XLA_FLAGS', xla_flags(1))
  spec = write_sweep(tmp_path, data_cache, seeds=(0,), num_steps=40, checkpoint_every=4)
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
  spec = write_sweep(tmp_path, data_cache, seeds=(0, 1, 2), num_steps=40,
                     checkpoint_every=4)
  workdir = tmp_path / 'sweep'
  (workdir / 'seed=1').mkdir(parents=True)
  (workdir / 'seed=1' / 'status.json').write_text(json.dumps({'state': 'finished', 'step': 40}))
  result = subprocess.run(
      sweep_command(spec, workdir, '--launcher=slurm', '--slurm_partition=gpu', '--slurm_nodes=2',
                    '--slurm_gpus_per_node=4', '--slurm_time_min=120'),
      cwd=REPO, env={**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}'}, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  assert '[2/3] seed=1: finished, not submitted' in result.stdout
  assert 'seed=0: submitted as job 4242_0' in result.stdout
  assert 'seed=2: submitted as job 4242_1' in result.stdout
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
