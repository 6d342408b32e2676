"""Trains a Transformer translation model from a config file.

  python train.py --config=configs/multi30k.py --workdir=runs/m30k
  python train.py --config=configs/multi30k.py --workdir=runs/post_ln --config.model.norm_position=post
  python train.py --helpconfig    # every --config.SECTION.FIELD with its default and meaning

  python train.py --config=configs/multi30k.py --workdir=runs/m30k_seeds --seeds=0,1,2,3
  python train.py --config=configs/sweeps/xiong2020.py:converge_key \
      --workdir='runs/post,warmup={optim.warmup_steps},seed={seed}' \
      --config.model.norm_position=post --vary=optim.warmup_steps=0,4000 --seeds=0,1,2

--seeds and --vary train members of the config together, as one compiled program
(training/members.py): each --seeds value once for each --vary column (--vary lists give one
value per member, zipped, so the second command trains 6 runs). A member may differ in seed,
peak rate (optim.learning_rate) and warmup (optim.warmup_steps). Each member has its own run
folder: --workdir with '{seed}' and '{KEY}' replaced, else WORKDIR/seed=N (or
WORKDIR/warmup_steps=W,seed=N and so on).
Re-running the same command on an existing workdir resumes from its latest checkpoint
(params, optimizer state, step and data-iterator position; dropout keys derive from the step).
The loop is training/trainer.py; what the workdir receives, training/run_dir.py.
"""

import sys

from absl import app, flags, logging
import jax

from data import datasets, sources
from training import checkpointing, command_line, partitioning, run_dir, run_log, stop_signals
from training import members, trainer

WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (created or resumed).', required=True)
SEEDS = flags.DEFINE_list('seeds', None, 'Train these train.seed values together in one compiled '
                          "program, each in its own run folder (--workdir with '{seed}' replaced, "
                          'else WORKDIR/seed=N).')
VARY = flags.DEFINE_multi_string('vary', [], 'KEY=V1,V2,...: members trained together differ in '
                                 'KEY (optim.learning_rate, optim.warmup_steps or train.seed), one '
                                 "value per member; '{KEY}' in --workdir names each one's folder.")
command_line.define_config_flag()
# Listed by --help (flags defined in another module are otherwise shown only by --helpfull).
flags.declare_key_flag('config')
flags.declare_key_flag('helpconfig')
COORDINATOR_ADDRESS = flags.DEFINE_string('coordinator_address', None,
                                          'host:port of process 0 (multi-process runs).')
NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-process run.')
PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Index of this process.')
MULTIPROCESS = flags.DEFINE_bool('multiprocess', False, 'Call jax.distributed.initialize (the three '
                                 'flags above, or auto-detection on TPU pods and SLURM).')


def main(argv):
  del argv
  if MULTIPROCESS.value:
    partitioning.initialize_distributed(COORDINATOR_ADDRESS.value, NUM_PROCESSES.value, PROCESS_ID.value)
  config = command_line.config_from_flags()
  try:
    group = members.parse_members(SEEDS.value, VARY.value) if SEEDS.value or VARY.value else None
    workdirs = members.member_workdirs(WORKDIR.value, group) if group else [WORKDIR.value]
    if group:
      members.member_configs(config, group)  # each value parses as its field's type
  except ValueError as error:
    raise SystemExit(str(error)) from None
  try:
    for workdir in workdirs:
      run_dir.check_reachable(workdir)
      run_dir.make_run_folder(workdir)
  except run_dir.RunFolderError as error:
    raise SystemExit(str(error)) from None
  try:
    # Members trained together share one process: each member's train.log holds its library log.
    for workdir in workdirs[1:]:
      run_log.add_library_log_file(run_dir.path(workdir, run_dir.LOG_FILE))
    run_log.route_library_logging(run_dir.path(workdirs[0], run_dir.LOG_FILE),
                                  to_terminal=flags.FLAGS['verbosity'].present)
  except OSError as error:
    raise SystemExit(f'cannot write the run folder: {run_dir.os_error_line(error)}') from None
  # Compiled train and eval steps are reused across restarts and sweep runs of the same shapes
  # (10-20 s per batch shape on a 2-core CPU).
  jax.config.update('jax_compilation_cache_dir', str(datasets.compilation_cache_dir(config.data)))
  try:
    if group:
      members.train_members(config, workdirs, group)
    else:
      trainer.train_and_evaluate(config, WORKDIR.value)
  except run_log.DivergenceError as error:
    raise SystemExit(f'diverged: {error}') from None
  except stop_signals.RunStopped as stopped:
    print(stopped, file=sys.stderr, flush=True)
    sys.exit(stopped.exit_code)
  except (run_dir.RunFolderError, checkpointing.CheckpointError, sources.SourceError) as error:
    raise SystemExit(str(error)) from None
  except ValueError as error:
    # A config value only the data can refute (a vocabulary size sentencepiece cannot train).
    logging.info('stopped by a ValueError', exc_info=True)  # train.log only
    raise SystemExit(f'invalid config: {error}') from None
  except OSError as error:
    # A file the run cannot read or write (permissions, a full disk): one line here, the
    # traceback in train.log.
    logging.info('stopped by an OSError', exc_info=True)  # train.log only
    raise SystemExit(run_dir.os_error_line(error)) from None
  except KeyboardInterrupt:
    # Ctrl-C before training started (while preparing data or compiling): nothing to save.
    print('interrupted before training started', file=sys.stderr, flush=True)
    sys.exit(130)


if __name__ == '__main__':
  app.run(main, flags_parser=command_line.parse_flags)
