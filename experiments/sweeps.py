"""Expands a config file's sweep into named train.py runs and decides which runs still need training.

A sweep config is an ordinary config file (`get_config(preset)`, usable by train.py on its own)
that also defines `sweep(preset)`, returning or yielding override dicts with dotted keys:

  def sweep(preset='warmup'):
    for warmup in (0, 500, 4000):
      yield {'model.norm_position': 'post', 'optim.warmup_steps': warmup}

Each dict becomes one run: its train.py arguments are the config file with its preset plus one
`--config.KEY=VALUE` per override, and its name, made from the overrides
('norm_position=post,warmup=0'), is its folder under the sweep's workdir. Every run's config
is parsed here by the same ml_collections flag machinery train.py uses, and validated, so a
misspelled key or a value of the wrong type fails before anything trains.

Seeds are an axis of their own: `--seeds=N` (scripts/sweep.py), or `seeds(preset)` returning N in
the sweep config, repeats every point with train.seed = 0 .. N-1 (the run name ends in ',seed=S'),
and the report groups the runs that differ only in seed into mean and standard deviation.

WORKDIR/sweep.json records the config, the extra arguments and every run's overrides; the report
reads the swept fields from it.
"""

import ctypes
import dataclasses
import importlib.util
import json
import os
from pathlib import Path
import re
import signal
from typing import Any

from etils import epath
import ml_collections

from training import command_line
from training.member_fields import MEMBER_FIELDS
from training.run_dir import CHECKPOINT_DIR, STATUS_FILE, replace_text

SWEEP_FILE = 'sweep.json'
# The config field the seeds axis sets; the report groups runs that differ only in it.
SEED_FIELD = 'train.seed'
# The program every run trains in (locally, per host, or in a SLURM job).
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[1] / 'train.py')
# An argument applied to every run: --config.KEY=VALUE.
_EXTRA_ARG = re.compile(r'--config\.([A-Za-z0-9_.]+)=(.*)', re.DOTALL)
# Labels of long field names in run names and report columns.
_ABBREVIATIONS = {'learning_rate': 'lr', 'warmup_steps': 'warmup', 'num_encoder_layers': 'enc_layers',
                  'num_decoder_layers': 'dec_layers'}


@dataclasses.dataclass(frozen=True)
class Run:
  """One point of a sweep."""
  # Folder name under the sweep's workdir, derived from `overrides`.
  name: str
  # Dotted config key -> value, as sweep() gave them.
  overrides: dict[str, Any]
  # train.py's arguments, --workdir included.
  args: tuple[str, ...]
  # The config train.py will build from `args`.
  config: ml_collections.ConfigDict


def split_spec(spec: str) -> tuple[str, str | None]:
  """'configs/sweeps/xiong2020.py:depth' -> ('configs/sweeps/xiong2020.py', 'depth')."""
  path, _, preset = spec.partition(':')
  return path, preset or None


def _load_module(spec: str):
  """The module of config file[:preset] `spec`."""
  path, _ = split_spec(spec)
  if not os.path.isfile(path):
    raise ValueError(f'{path}: no such config file')
  module_spec = importlib.util.spec_from_file_location('sweep_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_overrides(spec: str) -> list[dict[str, Any]]:
  """The override dicts of the sweep() of config file[:preset] `spec`, in its order."""
  path, preset = split_spec(spec)
  module = _load_module(spec)
  if not callable(getattr(module, 'sweep', None)):
    raise ValueError(f'{path} defines no sweep(preset): it describes one run; pass it to train.py')
  overrides = list(module.sweep() if preset is None else module.sweep(preset))
  if not overrides:
    raise ValueError(f'{spec}: sweep() gives no runs')
  for item in overrides:
    if not isinstance(item, dict) or not item:
      raise ValueError(f'{spec}: sweep() gave {item!r}, not a non-empty dict of overrides')
  return overrides


def default_seeds(spec: str) -> int:
  """Seeds per point the sweep config asks for (its optional `seeds(preset)`), else 1."""
  _, preset = split_spec(spec)
  seeds = getattr(_load_module(spec), 'seeds', None)
  if seeds is None:
    return 1
  return seeds() if preset is None else seeds(preset)


def with_seeds(all_overrides: list[dict[str, Any]], seeds: int, spec: str) -> list[dict[str, Any]]:
  """Every point repeated with train.seed = 0 .. seeds-1, seeds adjacent; unchanged for one seed."""
  if not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f'{spec}: seeds={seeds!r} must be a positive integer')
  if seeds == 1:
    return all_overrides
  if any(SEED_FIELD in overrides for overrides in all_overrides):
    raise ValueError(f'{spec} sweeps {SEED_FIELD} itself, so it cannot be repeated over seeds')
  return [{**overrides, SEED_FIELD: seed} for overrides in all_overrides for seed in range(seeds)]


def swept_fields(all_overrides: list[dict[str, Any]]) -> list[str]:
  """Every key any run overrides, in order of first appearance."""
  return list(dict.fromkeys(key for overrides in all_overrides for key in overrides))


def field_labels(keys: list[str]) -> dict[str, str]:
  """Short labels for run names and report columns.

  A key's last component, abbreviated for a few long, often swept fields; the whole key where two
  keys would share a label.
  """
  short = [key.rsplit('.', 1)[-1] for key in keys]
  short = [_ABBREVIATIONS.get(label, label) for label in short]
  return {key: label if short.count(label) == 1 else key for key, label in zip(keys, short)}


def field_named(name: str, keys: list[str]) -> str | None:
  """The key of `keys` that `name` names, as the dotted key or its `field_labels` label; None if none."""
  labels = field_labels(keys)
  return next((key for key in keys if name in (key, labels[key])), None)


def _name_value(value: Any) -> str:
  if isinstance(value, float):
    text = f'{value:g}'
  elif isinstance(value, (tuple, list)):
    text = '-'.join(map(_name_value, value))
  else:
    text = str(value)
  # Filesystem- and shell-safe: no slashes, spaces or quotes in folder names.
  return re.sub(r'[^A-Za-z0-9._+-]', '_', text)


def run_name(overrides: dict[str, Any], labels: dict[str, str]) -> str:
  """'norm_position=post,warmup=0,lr=0.0005': readable, deterministic, a folder name."""
  return ','.join(f'{labels[key]}={_name_value(value)}' for key, value in overrides.items())


def flag_value(value: Any) -> str:
  """VALUE of --config.KEY=VALUE, as config_flags parses it back ('post', '0.0005', 'True', '(1, 2)')."""
  return value if isinstance(value, str) else repr(value)


def _lookup(config: ml_collections.ConfigDict, key: str) -> Any:
  """config['a.b.c'], or KeyError naming the key."""
  node = config
  for part in key.split('.'):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      raise KeyError(key)
    node = node[part]
  return node


def _extra_keys(extra_args: list[str], spec: str, fields: list[str]) -> list[str]:
  """The config keys of '--config.KEY=VALUE' arguments for every run; none may be a swept field."""
  keys = []
  for arg in extra_args:
    match = _EXTRA_ARG.fullmatch(arg)
    if not match:
      raise ValueError(f'{arg!r} is not an override of every run: --config.KEY=VALUE')
    if match[1] in fields:
      raise ValueError(f'{arg!r}: {spec} sweeps {match[1]}, so it cannot be set for every run')
    keys.append(match[1])
  return keys


def expand(spec: str, workdir: str, extra_args: list[str] = (), seeds: int | None = None) -> list[Run]:
  """The runs of `spec`'s sweep under `workdir`, each config parsed and validated.

  Args:
    spec: 'config_file.py[:preset]'.
    workdir: Folder holding one subfolder per run.
    extra_args: '--config.KEY=VALUE' arguments given to every run (e.g. a longer num_steps).
    seeds: runs per point, seeds 0 .. seeds-1; None: the config's `seeds(preset)`, else 1.

  Raises:
    ValueError: with a one-line message: no such file, no sweep(), unknown preset, a key that is
      not a config field, a value train.py would parse differently, a bad config, or two runs
      with the same name.
  """
  all_overrides = with_seeds(load_overrides(spec),
                             default_seeds(spec) if seeds is None else seeds, spec)
  fields = swept_fields(all_overrides)
  extra_keys = _extra_keys(list(extra_args), spec, fields)
  base = command_line.parse_config_args([f'--config={spec}'])
  for key in [*fields, *extra_keys]:
    try:
      _lookup(base, key)
    except KeyError:
      raise ValueError(f'{spec}: {key} is not a config field') from None
  labels = field_labels(fields)
  runs = []
  for overrides in all_overrides:
    name = run_name(overrides, labels)
    if any(run.name == name for run in runs):
      raise ValueError(f'{spec}: two runs are named {name!r}; their overrides must differ')
    args = (f'--config={spec}', f'--workdir={os.path.join(workdir, name)}',
            *(f'--config.{key}={flag_value(value)}' for key, value in overrides.items()),
            *extra_args)
    try:
      config = command_line.parse_config_args(args)
    except ValueError as error:
      raise ValueError(f'{spec} run {name}: {error}') from None
    for key, value in overrides.items():
      parsed = _lookup(config, key)
      if parsed != (tuple(value) if isinstance(value, list) else value):
        raise ValueError(f'{spec} run {name}: {key}={value!r} reads back as {parsed!r} from the '
                         'command line; use a value of the field\'s type')
    runs.append(Run(name, dict(overrides), args, config))
  return runs


def _member_text(value: Any) -> str | None:
  """A member field's value as train.py --vary reads it and the run's name writes it, or None
  where the name's text would not parse back to the value (a rate of more than 6 digits)."""
  text = _name_value(value)
  return text if type(value)(text) == value else None


def member_groups(runs: list[Run]) -> list[list[Run]]:
  """The runs in groups that differ only in the fields members trained together may differ in
  (training/members.py: seed, peak rate, warmup), in sweep order."""
  groups: dict[tuple, list[Run]] = {}
  for run in runs:
    point = (tuple(run.overrides),  # the same fields, so that one name template fits them all
             *((key, repr(value)) for key, value in run.overrides.items()
               if key not in MEMBER_FIELDS or _member_text(value) is None))
    groups.setdefault(point, []).append(run)
  return list(groups.values())


def train_args(runs: list[Run]) -> tuple[str, ...]:
  """train.py's arguments that train `runs`: one run's own, or a member group's as one program:
  the first run's, less the fields the group varies, its folder a template with a placeholder
  for each, and --seeds (only seeds vary) or one --vary per field, a value per run."""
  if len(runs) == 1:
    return runs[0].args
  first = runs[0]
  varied = [key for key in MEMBER_FIELDS if len({repr(run.overrides.get(key)) for run in runs}) > 1]
  parts = first.name.split(',')
  if len(parts) != len(first.overrides):
    raise ValueError(f'run {first.name}: its name does not list its {len(first.overrides)} fields')
  template = ','.join(
      part.split('=', 1)[0] + '=' + ('{seed}' if key == SEED_FIELD else '{' + key + '}')
      if key in varied else part for key, part in zip(first.overrides, parts))
  args = []
  for arg in first.args:
    if arg.startswith('--workdir='):
      arg = '--workdir=' + os.path.join(os.path.dirname(arg[len('--workdir='):]), template)
    elif any(arg.startswith(f'--config.{key}=') for key in varied):
      continue
    args.append(arg)
  if varied == [SEED_FIELD]:
    return (*args, '--seeds=' + ','.join(str(run.overrides[SEED_FIELD]) for run in runs))
  return (*args, *(f'--vary={key}=' + ','.join(_member_text(run.overrides[key]) for run in runs)
                   for key in varied))


def host_share(units: list, num_hosts: int, host_index: int) -> list:
  """What host `host_index` of `num_hosts` trains when hosts split a sweep: every num_hosts-th
  unit (a run, or a point's seeds trained together) from its index, in sweep order.

  A fixed assignment (big_vision's and XManager's work-unit index), so each run belongs to one
  host: a host re-run after preemption resumes its own runs and never touches another's.
  """
  if num_hosts < 1 or not 0 <= host_index < num_hosts:
    raise ValueError(f'--host_index={host_index} must be in [0, --num_hosts={num_hosts})')
  return units[host_index::num_hosts]


def die_with_parent() -> None:
  """In a train.py child before exec: SIGTERM when its parent dies, even by kill -9 (Linux), so no
  train.py is left training a run that a re-run of the sweep would then find locked."""
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


def read_status(run_dir: str) -> dict | None:
  """RUN_DIR/status.json as train.py wrote it, or None before the run started."""
  path = epath.Path(run_dir) / STATUS_FILE
  return json.loads(path.read_text()) if path.is_file() else None


def plan(run_dir: str, config: ml_collections.ConfigDict, *, rerun_diverged: bool) -> str:
  """What the sweep does with a run: 'start', 'resume' (train.py continues from its checkpoint) or 'skip'.

  Finished runs are skipped unless num_steps has since grown past their last step; diverged runs
  are skipped unless asked, since resuming replays the same steps from the last good checkpoint.
  A 'stopped', 'running' or 'failed' run is resumed: it was stopped by a signal, killed or crashed.
  """
  status = read_status(run_dir)
  if status is None:
    return 'resume' if (epath.Path(run_dir) / CHECKPOINT_DIR).is_dir() else 'start'
  if status['state'] == 'finished':
    # With num_epochs set the step count depends on the data: trust 'finished'.
    longer = not config.train.num_epochs and status.get('step', 0) < config.train.num_steps
    return 'resume' if longer else 'skip'
  if status['state'] == 'diverged' and not rerun_diverged:
    return 'skip'
  return 'resume'


def _normalised(spec: str) -> tuple[str, str | None]:
  path, preset = split_spec(spec)
  return os.path.normpath(path), preset


def write_sweep_json(workdir: str, spec: str, extra_args: list[str], runs: list[Run]) -> None:
  """Records the sweep in WORKDIR/sweep.json; a workdir holds one sweep config and preset."""
  previous = read_sweep_json(workdir)
  if previous and _normalised(previous['config']) != _normalised(spec):
    raise ValueError(f'{workdir} holds the sweep of {previous["config"]}, not {spec}; '
                     'give each sweep its own --workdir')
  record = {'config': spec, 'extra_args': list(extra_args),
            'fields': swept_fields([run.overrides for run in runs]),
            'runs': [{'name': run.name, 'overrides': run.overrides} for run in runs]}
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  replace_text(epath.Path(workdir) / SWEEP_FILE, json.dumps(record, indent=2))


def read_sweep_json(workdir: str) -> dict | None:
  path = epath.Path(workdir) / SWEEP_FILE
  return json.loads(path.read_text()) if path.is_file() else None
