"""Reads a sweep's run folders and summarises every run: the rows of scripts/report.py.

A run folder holds what train.py leaves (README, Training): config.json, metrics.jsonl and
status.json, plus eval/<split>.json from eval.py. Any of them may be missing (a run not started,
one still running, one that diverged at step 40): a missing value is None here, empty in the CSV
and '–' in the Markdown table.
"""

import collections
import csv
import dataclasses
import io
import json
import math
import statistics
from typing import Any

from etils import epath

from experiments import sweeps
from training.run_dir import (CONFIG_FILE, EVAL_DIR, METRICS_FILE, STATUS_FILE, check_reachable,
                              flatten)

MISSING = '–'
# Numeric summary columns: CSV name, Markdown header, format.
_COLUMNS = (
    ('final_val_loss', 'final val loss', '.3f'),
    ('best_val_loss', 'best val loss', '.3f'),
    ('best_val_step', 'at step', 'd'),
    ('final_bleu', 'final BLEU', '.2f'),
    ('best_bleu', 'best BLEU', '.2f'),
    ('final_train_loss', 'final train loss', '.3f'),
    ('val_loss_change_last_fifth', 'val loss change, last fifth', '.1%'),
    ('loss_spikes', 'loss spikes', '.2g'),
    ('median_tokens_per_sec', 'tokens/s', '.0f'),
)
# A run has converged when its validation loss moved less than this over the last fifth of its steps.
CONVERGED_CHANGE = 0.01
# A loss spike: a logged window whose mean training loss is above this multiple of the window before.
SPIKE_FACTOR = 1.5


@dataclasses.dataclass
class RunRecords:
  """Everything read from one run folder."""
  name: str
  # Swept field (dotted key) -> the run's value, None where unknown.
  values: dict[str, Any]
  # status.json, None before the run started.
  status: dict | None
  # metrics.jsonl's training and evaluation records, in step order.
  train: list[dict]
  evals: list[dict]
  # eval.py's report per split, from eval/<split>.json.
  eval_files: dict[str, dict]
  # config.json, {} when absent.
  config: dict


def read_metrics(run_dir: str) -> tuple[list[dict], list[dict]]:
  """Training and evaluation records of the run's final history, in step order.

  A resumed run appends again from its last checkpoint, so a record at or before a step already
  seen replaces the stopped attempt's records from that step on. A line cut short by a crash is
  skipped.
  """
  train, evals = [], []
  path = epath.Path(run_dir) / METRICS_FILE
  if not path.is_file():
    return train, evals
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if 'eval_loss' in record:
      records = evals
    elif 'train_loss' in record:
      records = train
    else:  # epoch timing and time-budget plan records
      continue
    while records and records[-1]['step'] >= record['step']:
      records.pop()
    records.append(record)
  return train, evals


def _read_json(path: epath.Path) -> dict:
  return json.loads(path.read_text()) if path.is_file() else {}


def _run_folders(sweep_dir: epath.Path) -> list[str]:
  names = sorted(entry.name for entry in sweep_dir.iterdir() if entry.is_dir())
  return [name for name in names if any(
      (sweep_dir / name / file).is_file() for file in (CONFIG_FILE, STATUS_FILE, METRICS_FILE))]


def load_runs(sweep_dir: str, compare: list[str] | None = None,
              up_to_step: int | None = None) -> tuple[list[RunRecords], list[str]]:
  """The sweep's runs and its swept fields (dotted keys).

  Runs and fields come from sweep.json (scripts/sweep.py writes it), listing runs not started yet
  too; without it (runs launched from --dry_run commands elsewhere), every subfolder with run files
  is a run and the swept fields are the config fields whose values differ between runs.
  `compare` (dotted keys or their report labels, e.g. 'lr') names the fields instead, so that runs
  whose configs also differ in what does not change the compared steps (a shortened
  `train.num_steps`, `train.steps_per_call`) still group over seeds. `up_to_step` keeps each run's
  records to that step, so that runs of different lengths compare at one.

  Raises:
    ValueError: if `sweep_dir` is not a folder or holds no run, or a `compare` field is in no
      run's config.
  """
  check_reachable(sweep_dir)
  folder = epath.Path(sweep_dir)
  if not folder.is_dir():
    raise ValueError(f'{sweep_dir}: no such folder')
  sweep = sweeps.read_sweep_json(sweep_dir)
  if sweep:
    names = [run['name'] for run in sweep['runs']]
    overrides = {run['name']: run['overrides'] for run in sweep['runs']}
  else:
    names, overrides = _run_folders(folder), {}
  if not names:
    raise ValueError(f'{sweep_dir} holds no sweep.json and no run folder (config.json, status.json '
                     'or metrics.jsonl)')
  configs = {name: flatten(_read_json(folder / name / CONFIG_FILE)) for name in names}
  keys = list(dict.fromkeys(key for config in configs.values() for key in config))
  if compare:
    fields = _compared_fields(compare, keys + list(sweep['fields'] if sweep else []))
  elif sweep:
    fields = sweep['fields']
  else:
    fields = [key for key in keys if len({json.dumps(config.get(key)) for config in configs.values()}) > 1]
  runs = []
  for name in names:
    run_dir = folder / name
    eval_dir = run_dir / EVAL_DIR
    splits = sorted(file.name[:-len('.json')] for file in eval_dir.iterdir()
                    if file.name.endswith('.json')) if eval_dir.is_dir() else []
    values = {field: configs[name].get(field, overrides.get(name, {}).get(field)) for field in fields}
    train, evals = read_metrics(run_dir)
    if up_to_step is not None:
      train, evals = ([record for record in records if record['step'] <= up_to_step]
                      for records in (train, evals))
    runs.append(RunRecords(
        name=name, values=values, status=sweeps.read_status(run_dir), train=train, evals=evals,
        eval_files={split: _read_json(eval_dir / f'{split}.json') for split in splits},
        config=_read_json(run_dir / CONFIG_FILE)))
  return runs, fields


def _compared_fields(compare: list[str], keys: list[str]) -> list[str]:
  """The dotted keys `compare` names, by key or by report label, and the seed where runs have one."""
  keys = list(dict.fromkeys(keys))
  fields = [sweeps.field_named(name, keys) for name in compare]
  unknown = [name for name, field in zip(compare, fields) if field is None]
  if unknown:
    raise ValueError(f'--fields={",".join(unknown)} is in no run\'s config.json (fields: a dotted '
                     'key such as optim.learning_rate, or its report label such as lr)')
  return fields + [sweeps.SEED_FIELD] * (sweeps.SEED_FIELD in keys and sweeps.SEED_FIELD not in fields)


def last_fifth_change(evals: list[dict]) -> float | None:
  """|L_end - L_start| / L_start of validation loss, L_end the last validation's and L_start the last
  one at or before 80% of its step; None without two such validations."""
  finite = [record for record in evals if math.isfinite(record['eval_loss'])]
  if len(finite) < 2:
    return None
  last = finite[-1]
  starts = [record for record in finite[:-1] if record['step'] <= 0.8 * last['step']]
  if not starts:
    return None
  start = starts[-1]['eval_loss']
  return abs(last['eval_loss'] - start) / start


def loss_spikes(train: list[dict]) -> int:
  """Logged windows whose mean training loss is above SPIKE_FACTOR times the window before's."""
  losses = [record['train_loss'] for record in train]
  return sum(after > SPIKE_FACTOR * before for before, after in zip(losses, losses[1:]))


def state_text(status: dict | None) -> str:
  """'finished', 'diverged@40', 'stopped@80', 'failed@120', 'running@250' or 'not started'."""
  if status is None:
    return 'not started'
  if status['state'] == 'finished':
    return 'finished'
  return f'{status["state"]}@{status.get("step", "?")}'


def summarise(run: RunRecords) -> dict[str, Any]:
  """The run's numbers, keyed by CSV column; None where the records lack them."""
  finite = [r for r in run.evals if math.isfinite(r['eval_loss'])]
  best = min(finite, key=lambda r: r['eval_loss']) if finite else None
  bleus = [r['bleu'] for r in run.evals if r.get('bleu') is not None]
  speeds = [r['tokens_per_sec'] for r in run.train if r.get('tokens_per_sec') is not None]
  summary = {
      'final_val_loss': run.evals[-1]['eval_loss'] if run.evals else None,
      'best_val_loss': best['eval_loss'] if best else None,
      'best_val_step': best['step'] if best else None,
      'final_bleu': bleus[-1] if bleus else None,
      'best_bleu': max(bleus) if bleus else None,
      'final_train_loss': run.train[-1]['train_loss'] if run.train else None,
      'val_loss_change_last_fifth': last_fifth_change(run.evals),
      'loss_spikes': loss_spikes(run.train) if run.train else None,
      # The median leaves out the first window, which includes compilation.
      'median_tokens_per_sec': statistics.median(speeds) if speeds else None,
  }
  for split, report in run.eval_files.items():
    summary[f'{split}_bleu'] = report.get('bleu')
    summary[f'{split}_tokenized_bleu'] = report.get('tokenized_bleu')
  return summary


def _splits(runs: list[RunRecords]) -> list[str]:
  return sorted({split for run in runs for split in run.eval_files})


def table(runs: list[RunRecords], fields: list[str]) -> tuple[list[str], list[list[str]], list[dict]]:
  """Markdown header, Markdown rows (text) and CSV rows (raw values) of every run."""
  labels = sweeps.field_labels(fields)
  columns = list(_COLUMNS)
  for split in _splits(runs):
    columns += [(f'{split}_bleu', f'{split} BLEU', '.2f'),
                (f'{split}_tokenized_bleu', f'{split} tok. BLEU', '.2f')]
  header = ['run', *(labels[field] for field in fields), 'state', *(title for _, title, _ in columns)]
  text_rows, csv_rows = [], []
  for run in runs:
    summary = summarise(run)
    numbers = [summary.get(key) for key, _, _ in columns]
    text_rows.append([run.name, *(MISSING if run.values[field] is None else str(run.values[field])
                                  for field in fields), state_text(run.status),
                      *(MISSING if value is None else format(value, spec)
                        for value, (_, _, spec) in zip(numbers, columns))])
    csv_rows.append({'run': run.name, **{labels[field]: run.values[field] for field in fields},
                     'state': run.status['state'] if run.status else 'not started',
                     'state_step': run.status.get('step') if run.status else None,
                     **{key: value for value, (key, _, _) in zip(numbers, columns)}})
  return header, text_rows, csv_rows


def seed_groups(runs: list[RunRecords], fields: list[str]) -> list[list[RunRecords]]:
  """Runs that differ only in their seed (sweeps.SEED_FIELD), grouped in order of first appearance;
  one run per group when the seed is not swept."""
  others = [field for field in fields if field != sweeps.SEED_FIELD]
  groups: dict[str, list[RunRecords]] = {}
  for run in runs:
    key = json.dumps([run.values[field] for field in others]) if sweeps.SEED_FIELD in fields else run.name
    groups.setdefault(key, []).append(run)
  return list(groups.values())


def mean_and_std(values: list[float]) -> tuple[float, float | None]:
  """Mean and sample standard deviation (n - 1); no spread from a single value."""
  return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def spread_text(mean: float, std: float | None, spec: str) -> str:
  """'4.415 ± 0.026', or the mean alone where there is no spread."""
  return format(mean, spec) if std is None else f'{mean:{spec}} ± {std:{spec}}'


def _spread_text(values: list[float], spec: str, size: int) -> str:
  if not values:
    return MISSING
  spec = '.0f' if spec == 'd' else spec  # the mean of steps is no integer
  text = spread_text(*mean_and_std(values), spec)
  # Fewer values than seeds (a diverged or unfinished seed has none): say over how many.
  return text if len(values) == size else f'{text} (n={len(values)})'


def seed_table(runs: list[RunRecords], fields: list[str]) -> tuple[list[str], list[list[str]], list[dict]]:
  """One row per group of runs that differ only in seed: every numeric column as mean ± sample
  standard deviation over the seeds that have it, and how many seeds ended in each state.

  Returns the Markdown header, Markdown rows and CSV rows (`<column>_mean`, `_std`, `_n`).
  """
  others = [field for field in fields if field != sweeps.SEED_FIELD]
  labels = sweeps.field_labels(fields)
  columns = [*_COLUMNS[:-1]]  # speed is a property of the machine, not of the seed
  for split in _splits(runs):
    columns += [(f'{split}_bleu', f'{split} BLEU', '.2f'),
                (f'{split}_tokenized_bleu', f'{split} tok. BLEU', '.2f')]
  header = [*(labels[field] for field in others), 'seeds', 'states',
            *(title for _, title, _ in columns)]
  text_rows, csv_rows = [], []
  for group in seed_groups(runs, fields):
    summaries = [summarise(run) for run in group]
    states = collections.Counter(state_text(run.status).split('@')[0] for run in group)
    states_text = ', '.join(f'{count} {state}' for state, count in states.items())
    row = [*(MISSING if group[0].values[field] is None else str(group[0].values[field])
             for field in others), str(len(group)), states_text]
    csv_row = {**{labels[field]: group[0].values[field] for field in others},
               'seeds': len(group), 'states': states_text}
    for key, _, spec in columns:
      values = [summary[key] for summary in summaries if summary.get(key) is not None]
      row.append(_spread_text(values, spec, len(group)))
      mean, std = mean_and_std(values) if values else (None, None)
      csv_row.update({f'{key}_mean': mean, f'{key}_std': std, f'{key}_n': len(values)})
    text_rows.append(row)
    csv_rows.append(csv_row)
  return header, text_rows, csv_rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
  lines = [header, ['---'] * len(header), *rows]
  return '\n'.join('| ' + ' | '.join(cells) + ' |' for cells in lines) + '\n'


def write_csv(path: epath.Path, rows: list[dict]) -> None:
  """One row per run; missing values are empty cells."""
  text = io.StringIO(newline='')
  writer = csv.DictWriter(text, fieldnames=list(rows[0]))
  writer.writeheader()
  writer.writerows({key: '' if value is None else value for key, value in row.items()} for row in rows)
  path.write_text(text.getvalue())
