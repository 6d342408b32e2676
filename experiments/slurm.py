"""A sweep's runs as SLURM jobs through submitit: one job per run, submitted as one job array.

Each job trains its run with train.py in a child process, adding --multiprocess when the job has
several tasks (nodes), so jax.distributed takes coordinator, process count and index from SLURM's
environment. Before the time limit, and on preemption where the cluster signals it, submitit sends
the job USR2 (`--signal=USR2@90` in its sbatch file); `RunJob.checkpoint` then sends train.py
SIGTERM, waits while it saves and stops, and hands submitit the same job to requeue, which
resumes the run from that checkpoint. A job whose run is already finished (a second submission of
the sweep) returns at once.
"""

import os
import signal
import subprocess
import sys

import submitit

from experiments import sweeps
from training import command_line


class RunJob(submitit.helpers.Checkpointable):
  """One sweep run: `train.py ARGS` until the run is finished or diverged."""

  def __init__(self, train_args: tuple[str, ...], run_dir: str, rerun_diverged: bool = False):
    self.train_args = tuple(train_args)
    self.run_dir = run_dir
    self.rerun_diverged = rerun_diverged
    self._child: subprocess.Popen | None = None

  def __call__(self) -> str:
    """Trains the run; returns its final state ('finished' or 'diverged').

    Raises:
      RuntimeError: train.py failed; its output is in the job's log (submitit's folder).
    """
    config = command_line.parse_config_args(self.train_args)
    if sweeps.plan(self.run_dir, config, rerun_diverged=self.rerun_diverged) == 'skip':
      return sweeps.read_status(self.run_dir)['state']
    several_tasks = submitit.JobEnvironment().num_tasks > 1
    command = [sys.executable, sweeps.TRAIN_SCRIPT, *self.train_args,
               *(['--multiprocess'] if several_tasks else [])]
    print(f'{self.run_dir}: {" ".join(command)}', flush=True)
    self._child = subprocess.Popen(command, preexec_fn=sweeps.die_with_parent)
    code = self._child.wait()
    state = (sweeps.read_status(self.run_dir) or {}).get('state', 'failed')
    if (code, state) in ((0, 'finished'), (1, 'diverged')):
      return state
    raise RuntimeError(f'{self.run_dir}: train.py ended with exit status {code}, run {state}; '
                       'submit the sweep again to resume it')

  def checkpoint(self) -> submitit.helpers.DelayedSubmission:
    """Stops train.py with a save, then asks for the same job again (which resumes).

    Runs inside submitit's signal handler, which interrupted __call__'s wait on the child: the
    child is signalled and reaped with os calls, since subprocess's own wait holds its lock there.
    """
    if self._child is not None:
      try:
        os.kill(self._child.pid, signal.SIGTERM)
        os.waitpid(self._child.pid, 0)
      except (ProcessLookupError, ChildProcessError):
        pass  # it had already ended
    return submitit.helpers.DelayedSubmission(
        RunJob(self.train_args, self.run_dir, self.rerun_diverged))


def submit(runs: list[sweeps.Run], workdir: str, executor: submitit.Executor, *,
           rerun_diverged: bool) -> list[submitit.Job]:
  """Submits one RunJob per run, as one job array where the executor makes them."""
  with executor.batch():
    jobs = [executor.submit(RunJob(run.args, os.path.join(workdir, run.name), rerun_diverged))
            for run in runs]
  return jobs
