"""Helpers of the sweep tests that train: a smoke-model sweep config, sweep.py commands, and what
a run folder says."""

import json
import os
import sys
import textwrap
import time


def write_sweep(tmp_path, data_cache, *, seeds, num_steps, checkpoint_every, pack_length=0):
  """A sweep over seeds of the smoke model. Its runs share compiled programs (JAX's persistent
  cache), so only the first run compiles, ~10 s per batch shape on a 2-core CPU. Packed rows
  (pack_length > 0) have one batch shape; a test that stops a run mid-way keeps the bucketed
  shapes, whose compilations leave it time to."""
  path = tmp_path / 'sweep_config.py'
  path.write_text(textwrap.dedent(f"""
      from configs import smoke

      def get_config():
        config = smoke.get_config()
        config.data.update(cache_dir={str(data_cache)!r}, eval_examples=8, pack_length={pack_length})
        config.train.update(num_steps={num_steps}, log_every=2, eval_every={num_steps},
                            checkpoint_every={checkpoint_every})
        return config

      def sweep():
        for seed in {tuple(seeds)!r}:
          yield {{'train.seed': seed}}
      """))
  return str(path)


def sweep_command(spec, workdir, *args):
  return [sys.executable, '-m', 'scripts.sweep', spec, f'--workdir={workdir}', *args]


# LLVM's optimisation off, for the test session (tests/conftest.py) and the processes it starts.
NO_LLVM_OPTIMISATION = '--xla_backend_optimization_level=0'


def xla_flags(devices):
  """XLA_FLAGS of a test's train.py or sweep.py process: the CPU split into `devices` devices, and
  LLVM's optimisation off. Such a process compiles for most of its life and trains a few steps:
  without the optimisation a 6-step smoke run takes a third less CPU time (22 s against 34 s on a
  2-core CPU). The in-process tests gain as well: with an empty compilation cache the whole suite
  takes about a sixth less time, and the tests that train longest in-process (an epoch, a model
  that learns) lose a few seconds each."""
  return f'--xla_force_host_platform_device_count={devices} {NO_LLVM_OPTIMISATION}'


def env_with_devices(count):
  return {**os.environ, 'CI': '1', 'XLA_FLAGS': xla_flags(count)}


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
