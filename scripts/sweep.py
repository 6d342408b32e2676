"""Runs the sweep a config file defines: on this machine, split over hosts, on a whole multi-host
slice, or as SLURM jobs.

  python -m scripts.sweep configs/sweeps/xiong2020.py:warmup --workdir=runs/xiong_warmup
  python -m scripts.sweep configs/sweeps/xiong2020.py:depth --workdir=runs/xiong_depth --dry_run
  python -m scripts.sweep configs/sweeps/xiong2020.py:norm --workdir=runs/xiong_norm --only=rms \
      --config.train.num_steps=2000

Where the runs train (docs/scaling.md):
- here (default): one train.py process per run, one after another.
- one run per host: the same command on N hosts with --num_hosts=N --host_index=I; host I trains
  every N-th run from the I-th, each on its own devices.
- whole slice: the same command on every host with --multiprocess; each run trains on all hosts'
  devices together (jax.distributed), in turn, in the sweep process (experiments/slice_sweep.py).
- SLURM: --launcher=slurm submits one job per run through submitit (experiments/slurm.py) and
  returns; jobs are requeued on time limit or preemption and resume.

Locally and per host, each run trains in its own train.py process, so JAX state never leaks
between runs and a run that diverges (exit status 1) does not stop the sweep; its output goes to
WORKDIR/RUN/train.log. Re-running the command skips finished runs, resumes stopped or failed ones
from their checkpoints and leaves diverged ones alone (--rerun_diverged resumes them too). SIGTERM
or Ctrl-C is passed to the running train.py, which saves and stops, and then the sweep stops; a
train.py whose sweep is killed outright gets SIGTERM too, so no run is left training behind a
re-run's back. --dry_run prints one shell command per run (of this host's share), for a launcher
of your own, and writes nothing. Arguments --config.KEY=VALUE are given to every run. --seeds=N
repeats every point over train.seed 0 .. N-1; --together trains the runs that differ only in seed,
peak rate and warmup in one train.py, as one compiled program (training/members.py), each still in
its own run folder. Exit status
1 when a run failed; diverging is a result.
"""

import collections
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags
from etils import epath

import jax

from experiments import sweeps
from training import command_line, partitioning, run_log, stop_signals
from training import run_dir as run_dir_lib

WORKDIR = flags.DEFINE_string('workdir', None, 'Folder of the sweep: one subfolder per run.',
                              required=True)
DRY_RUN = flags.DEFINE_bool('dry_run', False, "Print every run's train.py command; run nothing.")
ONLY = flags.DEFINE_multi_string('only', [], 'Only the runs whose name contains this text '
                                 '(repeatable: any of them).')
SEEDS = flags.DEFINE_integer('seeds', None, 'Repeat every point with train.seed 0 .. SEEDS-1 (default: '
                             "the sweep config's seeds(preset), else 1); the report gives mean and std.")
TOGETHER = flags.DEFINE_bool('together', False, 'Train each group of runs that differ only in seed, '
                              'peak rate and warmup, those that still need training, as one '
                              'program (train.py --seeds or --vary; here only).')
RERUN_DIVERGED = flags.DEFINE_bool('rerun_diverged', False, 'Resume diverged runs as well, after '
                                   'changing what made them diverge.')
NUM_HOSTS = flags.DEFINE_integer('num_hosts', 1, 'Hosts splitting the runs, each training its '
                                 'share on its own devices (one run per host at a time).')
HOST_INDEX = flags.DEFINE_integer('host_index', 0, 'This host in [0, --num_hosts): it trains runs '
                                  'host_index, host_index + num_hosts, ...')
MULTIPROCESS = flags.DEFINE_bool('multiprocess', False, 'Whole slice: join one jax.distributed job '
                                 'with the other hosts and train each run on all their devices.')
COORDINATOR_ADDRESS = flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 '
                                          '(--multiprocess; detected on TPU pods and SLURM).')
NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes of the --multiprocess job.')
PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Index of this process (--multiprocess).')
LAUNCHER = flags.DEFINE_enum('launcher', 'local', ['local', 'slurm'], 'local: train here; slurm: '
                             'submit one job per run through submitit and return.')
SLURM_PARTITION = flags.DEFINE_string('slurm_partition', None, 'SLURM partition (cluster default '
                                      'if unset).')
SLURM_TIME_MIN = flags.DEFINE_integer('slurm_time_min', 240, 'Time limit per job in minutes; a '
                                      'job reaching it saves and is requeued.')
SLURM_NODES = flags.DEFINE_integer('slurm_nodes', 1, 'Nodes per run (one task each; more than one '
                                   'trains the run with jax.distributed over them).')
SLURM_CPUS_PER_TASK = flags.DEFINE_integer('slurm_cpus_per_task', 8, 'CPUs per node of a run.')
SLURM_GPUS_PER_NODE = flags.DEFINE_integer('slurm_gpus_per_node', 0, 'GPUs per node of a run.')
SLURM_ARRAY_PARALLELISM = flags.DEFINE_integer('slurm_array_parallelism', 64, 'Runs of the job '
                                               'array running at once.')

USAGE = 'usage: sweep.py CONFIG_FILE[:PRESET] --workdir=DIR [--seeds=N] [--dry_run] [--only=TEXT] [--config.KEY=VALUE ...]'


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


def execute(runs: list[sweeps.Run], workdir: str, labels: list[str], forwarder: Forwarder) -> list[str]:
  """Trains (or skips) runs in one train.py subprocess: one run, or a group's members together
  (those that still need training); returns each run's state afterwards."""
  run_dirs = [os.path.join(workdir, run.name) for run in runs]
  actions = [sweeps.plan(run_dir, run.config, rerun_diverged=RERUN_DIVERGED.value)
             for run, run_dir in zip(runs, run_dirs)]
  for label, run_dir, action in zip(labels, run_dirs, actions):
    if action == 'skip':
      status = sweeps.read_status(run_dir)
      print(f'{label}: {status["state"]} at step {status.get("step")}, skipped', flush=True)
  pending = [index for index, action in enumerate(actions) if action != 'skip']
  if not pending:
    return [sweeps.read_status(run_dir)['state'] for run_dir in run_dirs]
  args = sweeps.train_args([runs[index] for index in pending])
  log_path = run_dir_lib.path(run_dirs[pending[0]], run_dir_lib.LOG_FILE)
  for index in pending:
    epath.Path(run_dirs[index]).mkdir(parents=True, exist_ok=True)
    together = ' (trained together)' if len(pending) > 1 else ''
    print(f'{labels[index]}: {actions[index]}{together}, log in {log_path}', flush=True)
  code, seconds = _train_subprocess([sys.executable, sweeps.TRAIN_SCRIPT, *args], log_path,
                                    ' '.join(sorted({actions[index] for index in pending})),
                                    forwarder)
  states = []
  for index, run_dir in enumerate(run_dirs):
    status = sweeps.read_status(run_dir) or {}
    state = status.get('state', 'failed')
    if index in pending:
      # Killed, or stopped before train.py wrote a status: the run failed whatever the file says.
      if state == 'running' or (code and state == 'finished'):
        state = 'failed'
      at_step = f' at step {status["step"]}' if 'step' in status else ''
      note = f' (exit status {code}; see the log)' if state == 'failed' else ''
      print(f'{labels[index]}: {state}{at_step} after {seconds / 60:.1f} min{note}', flush=True)
    states.append(state)
  return states


def _train_subprocess(command: list[str], log_path, action: str, forwarder: Forwarder):
  """Runs train.py's `command`, its output appended to `log_path`; returns its exit status and
  wall seconds."""
  start = time.perf_counter()
  # train.py's output goes to the run's train.log; on object storage, which a child process cannot
  # append to, through a local file copied there when the run ends.
  local = run_dir_lib.is_local(str(log_path))
  with (open(log_path, 'a') if local else tempfile.TemporaryFile('w+')) as log:
    log.write(f'# scripts/sweep.py ({action}): {shlex.join(command)}\n')
    log.flush()
    forwarder.child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=sweeps.die_with_parent)
    if forwarder.received is not None:  # arrived while the child was starting
      forwarder.child.send_signal(forwarder.received)
    code = forwarder.child.wait()
    forwarder.child = None
    if not local:
      log.seek(0)
      run_dir_lib.append_text(log_path, log.read())
  return code, time.perf_counter() - start


def check_modes() -> None:
  """One way of placing runs at a time; ValueError naming the clash."""
  if MULTIPROCESS.value and NUM_HOSTS.value > 1:
    raise ValueError('--multiprocess (each run on every host) and --num_hosts (runs split over '
                     'hosts) are two different modes; give one')
  if TOGETHER.value and (MULTIPROCESS.value or LAUNCHER.value == 'slurm'):
    raise ValueError('--together trains a group of runs in one train.py here (or per host with '
                     '--num_hosts); not with --multiprocess or --launcher=slurm')
  if LAUNCHER.value == 'slurm' and (MULTIPROCESS.value or NUM_HOSTS.value > 1):
    raise ValueError('--launcher=slurm places the runs itself: drop --multiprocess and --num_hosts '
                     '(--slurm_nodes trains one run over several nodes)')


def _units(runs: list[sweeps.Run]) -> list[list[sweeps.Run]]:
  """What each train.py trains: one run, or with --together a group of members."""
  return sweeps.member_groups(runs) if TOGETHER.value else [[run] for run in runs]


def train_here(runs: list[sweeps.Run], workdir: str) -> collections.Counter:
  """Each run in a train.py subprocess, in turn; stops the sweep on SIGTERM or SIGINT."""
  forwarder = Forwarder()
  states = collections.Counter()
  units = _units(runs)
  done = 0
  for unit in units:
    labels = [f'[{done + i}/{len(runs)}] {run.name}' for i, run in enumerate(unit, 1)]
    unit_states = execute(unit, workdir, labels, forwarder)
    done += len(unit)
    states.update(unit_states)
    if forwarder.received is not None:
      # The signal reached the run in training (stopped mid-way) or came as it ended.
      i, run, state = done, unit[-1], unit_states[-1]
      where = (f'during run {i} of {len(runs)} ({run.name}, {state})' if state != 'finished'
               else f'after run {i} of {len(runs)}')
      print(f'sweep {workdir}: stopped by {signal.Signals(forwarder.received).name} {where}; run '
            'the same command to resume', flush=True)
      sys.exit(128 + forwarder.received)
  return states


def submit_to_slurm(runs: list[sweeps.Run], workdir: str) -> None:
  """Submits the runs that still need training as one SLURM job array."""
  # Imported by the modes that use them, as below for the whole slice: a sweep run here or with
  # --dry_run starts ~1 s sooner without submitit and the trainer's libraries.
  import submitit  # pylint: disable=g-import-not-at-top
  from experiments import slurm  # pylint: disable=g-import-not-at-top
  try:
    executor = submitit.AutoExecutor(folder=os.path.join(workdir, 'slurm'), cluster='slurm')
  except RuntimeError as error:  # no srun or sbatch here
    raise SystemExit(f'sweep.py: --launcher=slurm: {error}') from None
  executor.update_parameters(
      name=os.path.basename(os.path.normpath(workdir)), timeout_min=SLURM_TIME_MIN.value,
      nodes=SLURM_NODES.value, tasks_per_node=1, cpus_per_task=SLURM_CPUS_PER_TASK.value,
      gpus_per_node=SLURM_GPUS_PER_NODE.value, slurm_partition=SLURM_PARTITION.value,
      slurm_array_parallelism=SLURM_ARRAY_PARALLELISM.value)
  pending = []
  for i, run in enumerate(runs, 1):
    run_dir = os.path.join(workdir, run.name)
    if sweeps.plan(run_dir, run.config, rerun_diverged=RERUN_DIVERGED.value) == 'skip':
      print(f'[{i}/{len(runs)}] {run.name}: {sweeps.read_status(run_dir)["state"]}, not submitted')
    else:
      pending.append(run)
  if not pending:
    return
  jobs = slurm.submit(pending, workdir, executor, rerun_diverged=RERUN_DIVERGED.value)
  for run, job in zip(pending, jobs):
    print(f'{run.name}: submitted as job {job.job_id}, log in {job.paths.stdout}', flush=True)
  print(f'sweep {workdir}: {len(jobs)} jobs submitted; run the same command after they end to '
        'submit what is left, then scripts/report.py', flush=True)


def main(argv: list[str]) -> None:
  spec, extra_args = argv[1], argv[2:]
  workdir = WORKDIR.value
  try:
    check_modes()
    run_dir_lib.check_reachable(workdir)
    if LAUNCHER.value == 'slurm' and not run_dir_lib.is_local(workdir):
      raise ValueError(f"--launcher=slurm keeps submitit's job files in WORKDIR/slurm, on the "
                       f"cluster's shared file system; --workdir={workdir} is not one")
    if MULTIPROCESS.value:
      # Library records (jax.distributed's, orbax's) go to each run's train.log, not the terminal.
      run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
      partitioning.initialize_distributed(COORDINATOR_ADDRESS.value, NUM_PROCESSES.value,
                                          PROCESS_ID.value)
    runs = sweeps.expand(spec, workdir, extra_args, SEEDS.value)
    selected = [run for run in runs if not ONLY.value or any(text in run.name for text in ONLY.value)]
    if not selected:
      raise ValueError(f'--only={",".join(ONLY.value)} matches none of the {len(runs)} runs: '
                       f'{", ".join(run.name for run in runs)}')
    # Hosts split the sweep by what one train.py trains, so that a point's seeds trained together
    # stay on one host.
    share = [run for unit in sweeps.host_share(_units(selected), NUM_HOSTS.value, HOST_INDEX.value)
             for run in unit]
    # One host or process writes the sweep's record.
    primary = HOST_INDEX.value == 0 and (not MULTIPROCESS.value or jax.process_index() == 0)
    if not DRY_RUN.value and primary:
      sweeps.write_sweep_json(workdir, spec, extra_args, runs)
  except ValueError as error:
    raise SystemExit(f'sweep.py: {error}') from None
  if DRY_RUN.value:
    for unit in _units(share):
      print(shlex.join(['python', os.path.relpath(sweeps.TRAIN_SCRIPT), *sweeps.train_args(unit)]))
    return
  if LAUNCHER.value == 'slurm':
    submit_to_slurm(share, workdir)
    return
  if MULTIPROCESS.value:
    from experiments import slice_sweep  # pylint: disable=g-import-not-at-top
    try:
      states = slice_sweep.train_in_turn(share, workdir, rerun_diverged=RERUN_DIVERGED.value)
    except stop_signals.RunStopped as stopped:
      print(f'sweep {workdir}: {stopped}', file=sys.stderr, flush=True)
      sys.exit(stopped.exit_code)
  else:
    states = train_here(share, workdir)
  whose = f' (host {HOST_INDEX.value} of {NUM_HOSTS.value})' if NUM_HOSTS.value > 1 else ''
  if primary or NUM_HOSTS.value > 1:
    print(f'sweep {workdir}{whose}: {len(share)} runs: {states["finished"]} finished, '
          f'{states["diverged"]} diverged, {states["failed"]} failed', flush=True)
  if states['failed']:
    sys.exit(1)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
