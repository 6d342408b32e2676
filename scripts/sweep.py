"""Runs the sweep a config file defines: every run locally, one after another, or their commands.

  python -m scripts.sweep configs/sweeps/xiong2020.py:warmup --workdir=runs/xiong_warmup
  python -m scripts.sweep configs/sweeps/xiong2020.py:depth --workdir=runs/xiong_depth --dry_run
  python -m scripts.sweep configs/sweeps/xiong2020.py:norm --workdir=runs/xiong_norm --only=rms \
      --config.train.num_steps=2000

Each run trains in its own train.py process, so JAX state never leaks between runs and a run that
diverges (exit status 1) does not stop the sweep; its output goes to WORKDIR/RUN/train.log.
Re-running the command skips finished runs, resumes stopped or failed ones from their checkpoints
and leaves diverged ones alone (--rerun_diverged resumes them too). SIGTERM or Ctrl-C is passed to
the running train.py, which saves and stops, and then the sweep stops; a train.py whose sweep is
killed outright gets SIGTERM too, so no run is left training behind a re-run's back. --dry_run prints one shell
command per run, for a cluster or TPU-pod launcher, and writes nothing. Arguments
--config.KEY=VALUE are given to every run. Exit status 1 when a run failed; diverging is a result.
"""

import collections
import ctypes
import os
from pathlib import Path
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags

from experiments import sweeps
from training import command_line
from training.run_dir import LOG_FILE

WORKDIR = flags.DEFINE_string('workdir', None, 'Folder of the sweep: one subfolder per run.',
                              required=True)
DRY_RUN = flags.DEFINE_bool('dry_run', False, "Print every run's train.py command; run nothing.")
ONLY = flags.DEFINE_multi_string('only', [], 'Only the runs whose name contains this text '
                                 '(repeatable: any of them).')
RERUN_DIVERGED = flags.DEFINE_bool('rerun_diverged', False, 'Resume diverged runs as well, after '
                                   'changing what made them diverge.')

TRAIN = Path(__file__).resolve().parents[1] / 'train.py'
USAGE = 'usage: sweep.py CONFIG_FILE[:PRESET] --workdir=DIR [--dry_run] [--only=TEXT] [--config.KEY=VALUE ...]'


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags, then [program, CONFIG, --config.KEY=VALUE...]; any error as one line."""
  extra_args = [arg for arg in argv[1:] if arg.startswith('--config.')]
  try:
    positional = flags.FLAGS([arg for arg in argv if not arg.startswith('--config.')])[1:]
  except flags.Error as error:
    raise SystemExit(f'sweep.py: {command_line.one_line_error(error)}\n{USAGE}') from None
  if len(positional) != 1:
    raise SystemExit(f'sweep.py: give one sweep config, e.g. configs/sweeps/xiong2020.py:warmup\n{USAGE}')
  return [argv[0], positional[0], *extra_args]


class Forwarder:
  """Passes SIGTERM and SIGINT on to the running train.py, which saves and stops; the sweep then
  stops too. The child runs in its own session, so a Ctrl-C reaches it once (from here), not
  twice (which would make it exit without saving)."""

  def __init__(self):
    self.child: subprocess.Popen | None = None
    self.received: int | None = None
    for signum in (signal.SIGTERM, signal.SIGINT):
      signal.signal(signum, self._forward)

  def _forward(self, signum, frame) -> None:
    del frame
    self.received = signum
    if self.child is not None and self.child.poll() is None:
      self.child.send_signal(signum)


def _die_with_parent() -> None:
  """In the child before exec: SIGTERM when the sweep dies, even by kill -9 (Linux), so no
  train.py is left training a run that a re-run of the sweep would then find locked."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


def execute(run: sweeps.Run, run_dir: str, label: str, forwarder: Forwarder) -> str:
  """Trains (or skips) one run in a train.py subprocess; returns its state afterwards."""
  action = sweeps.plan(run_dir, run.config, rerun_diverged=RERUN_DIVERGED.value)
  if action == 'skip':
    status = sweeps.read_status(run_dir)
    print(f'{label}: {status["state"]} at step {status.get("step")}, skipped', flush=True)
    return status['state']
  os.makedirs(run_dir, exist_ok=True)
  log_path = os.path.join(run_dir, LOG_FILE)
  print(f'{label}: {action}, log in {log_path}', flush=True)
  command = [sys.executable, str(TRAIN), *run.args]
  start = time.perf_counter()
  with open(log_path, 'a') as log:
    log.write(f'# scripts/sweep.py ({action}): {shlex.join(command)}\n')
    log.flush()
    forwarder.child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_die_with_parent)
    if forwarder.received is not None:  # arrived while the child was starting
      forwarder.child.send_signal(forwarder.received)
    code = forwarder.child.wait()
    forwarder.child = None
  status = sweeps.read_status(run_dir) or {}
  state = status.get('state', 'failed')
  # Killed, or stopped before train.py wrote a status: the run failed whatever the file says.
  if state == 'running' or (code and state == 'finished'):
    state = 'failed'
  at_step = f' at step {status["step"]}' if 'step' in status else ''
  note = f' (exit status {code}; see the log)' if state == 'failed' else ''
  print(f'{label}: {state}{at_step} after {(time.perf_counter() - start) / 60:.1f} min{note}', flush=True)
  return state


def main(argv: list[str]) -> None:
  spec, extra_args = argv[1], argv[2:]
  workdir = WORKDIR.value
  try:
    runs = sweeps.expand(spec, workdir, extra_args)
    selected = [run for run in runs if not ONLY.value or any(text in run.name for text in ONLY.value)]
    if not selected:
      raise ValueError(f'--only={",".join(ONLY.value)} matches none of the {len(runs)} runs: '
                       f'{", ".join(run.name for run in runs)}')
    if not DRY_RUN.value:
      sweeps.write_sweep_json(workdir, spec, extra_args, runs)
  except ValueError as error:
    raise SystemExit(f'sweep.py: {error}') from None
  if DRY_RUN.value:
    for run in selected:
      print(shlex.join(['python', os.path.relpath(TRAIN), *run.args]))
    return
  forwarder = Forwarder()
  states = collections.Counter()
  for i, run in enumerate(selected, 1):
    states[execute(run, os.path.join(workdir, run.name), f'[{i}/{len(selected)}] {run.name}',
                   forwarder)] += 1
    if forwarder.received is not None:
      print(f'sweep {workdir}: stopped by {signal.Signals(forwarder.received).name} after {i} of '
            f'{len(selected)} runs; run the same command to resume', flush=True)
      sys.exit(128 + forwarder.received)
  print(f'sweep {workdir}: {len(selected)} runs: {states["finished"]} finished, '
        f'{states["diverged"]} diverged, {states["failed"]} failed', flush=True)
  if states['failed']:
    sys.exit(1)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
