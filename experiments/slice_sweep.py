"""A sweep on a whole multi-host slice: each run trains on every host's devices together, in turn.

Every host starts the same `scripts/sweep.py --multiprocess` command; the sweep process joins one
jax.distributed job and trains each run in that process (`train_and_evaluate`), so a run's steps
are data-parallel over the whole slice. Whether a run is started, resumed or skipped is decided
once, by process 0 from the run folder, and broadcast: hosts that see a bucket or NFS folder at
slightly different moments still take the same decision. Only process 0 writes run-level records
(the trainer's rule) and prints the sweep's lines.

SIGTERM on any host (a preempted VM) reaches the others through JAX's preemption service: every
process stops the run at the same step after saving, and the sweep stops; the same command
resumes it.
"""

import collections
import logging
import os
import time

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np

from data import datasets, sources
from experiments import sweeps
from training import checkpointing, run_dir, run_log, trainer

_ACTIONS = ('start', 'resume', 'skip')


def agreed_action(run: sweeps.Run, folder: str, *, rerun_diverged: bool) -> str:
  """sweeps.plan's decision for the run as process 0 takes it, on every process."""
  code = _ACTIONS.index(sweeps.plan(folder, run.config, rerun_diverged=rerun_diverged)
                        ) if jax.process_index() == 0 else 0
  return _ACTIONS[int(multihost_utils.broadcast_one_to_all(np.int32(code)))]


def train_in_turn(runs: list[sweeps.Run], workdir: str, *, rerun_diverged: bool) -> collections.Counter:
  """Trains (or skips) each run on the whole slice; returns how many ended in each state.

  A diverged run or one that fails on its folder, checkpoints or data is counted and the sweep
  goes on, as with one train.py process per run; stop_signals.RunStopped ends the sweep.
  """
  primary = jax.process_index() == 0
  say = (lambda text: print(text, flush=True)) if primary else (lambda text: None)
  # As train.py: compiled steps are reused across runs and restarts (one cache per sweep).
  jax.config.update('jax_compilation_cache_dir', str(datasets.compilation_cache_dir(runs[0].config.data)))
  states = collections.Counter()
  for i, run in enumerate(runs, 1):
    label, folder = f'[{i}/{len(runs)}] {run.name}', os.path.join(workdir, run.name)
    action = agreed_action(run, folder, rerun_diverged=rerun_diverged)
    if action == 'skip':
      status = sweeps.read_status(folder) if primary else {}
      say(f'{label}: {status.get("state")} at step {status.get("step")}, skipped')
      states[status.get('state')] += 1
      continue
    epath.Path(folder).mkdir(parents=True, exist_ok=True)
    log_path = run_dir.path(folder, run_dir.LOG_FILE)
    say(f'{label}: {action} on {jax.process_count()} processes, {jax.device_count()} devices, '
        f'log in {log_path}')
    start = time.perf_counter()
    log_file = run_log.add_library_log_file(log_path) if primary else None
    try:
      trainer.train_and_evaluate(run.config, folder)
      state, note = 'finished', ''
    except run_log.DivergenceError as error:
      state, note = 'diverged', f' ({error})'
    except (run_dir.RunFolderError, checkpointing.CheckpointError, sources.SourceError) as error:
      state, note = 'failed', f' ({error})'
    finally:
      if log_file is not None:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    states[state] += 1
    say(f'{label}: {state} after {(time.perf_counter() - start) / 60:.1f} min{note}')
  return states
