"""Run and sweep folders on object storage: every read and write of them goes through etils.epath.

A stand-in bucket: `gs://bucket/...` paths are served from a local folder by epath's own mock
backend, which refuses appends as object storage does. Code that bypassed epath (open, os.path)
would look for a local folder literally named 'gs:' and fail or leave one behind.
"""

import importlib.util
import json
import logging
import os
from pathlib import Path
import subprocess
import sys

from etils import epath
from etils.epath import testing as epath_testing
import pytest

from experiments import report, results, sweeps
from training import run_dir, run_log

BUCKET = 'gs://bucket'
REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """Maps gs://bucket/X to tmp_path/bucket/X for epath; yields that local folder."""
  root = tmp_path / 'bucket'
  root.mkdir()
  monkeypatch.chdir(tmp_path)

  def local(path):
    text = os.fspath(path)
    return str(root / text[len(BUCKET) + 1:]) if text.startswith(BUCKET) else text

  def on_local(original, path, *args, **kwargs):
    return original(local(path), *args, **kwargs)

  def on_both(original, path, destination, **kwargs):
    return original(local(path), local(destination), **kwargs)

  def open_object(original, path, mode):
    if os.fspath(path).startswith(BUCKET):
      if 'a' in mode:
        raise OSError(f'{path}: object storage cannot append')
      if 'w' in mode:  # objects need no folder
        os.makedirs(os.path.dirname(local(path)), exist_ok=True)
    return original(local(path), mode)

  with epath_testing.mock_epath(
      open=open_object, exists=on_local, isdir=on_local, listdir=on_local, glob=on_local,
      makedirs=on_local, mkdir=on_local, remove=on_local, rmtree=on_local, stat=on_local,
      rename=on_both, replace=on_both, copy=on_both):
    yield root
  assert not (tmp_path / 'gs:').exists()  # nothing went around epath


class FakeSummaryWriter:
  """tensorboardX's writer, whose gs:// support needs the cloud SDK: records the folder only."""

  def __init__(self, logdir, purge_step, filename_suffix=""):
    self.logdir, self.purge_step = logdir, purge_step

  def add_scalar(self, *args, **kwargs):
    pass

  def flush(self):
    pass

  def close(self):
    pass


def test_run_records_on_a_bucket_are_written_read_and_truncated_on_resume(bucket, monkeypatch):
  monkeypatch.setattr(run_log, 'SummaryWriter', FakeSummaryWriter)
  workdir = f'{BUCKET}/sweep/norm=rms'
  writer = run_log.MetricsWriter(workdir, is_primary=True)
  for step in (2, 4, 6):
    writer.write(step, {'train_loss': 5.0 - step / 10})
  writer.write(4, {'eval_loss': 4.5})
  writer.close()
  run_log.write_status(workdir, 'stopped', step=6)
  # Resumed from the step-4 checkpoint: step 6 is trained again, its old record dropped.
  writer = run_log.MetricsWriter(workdir, is_primary=True, start_step=4)
  assert [record['step'] for record in writer.previous_records] == [2, 4, 4]
  writer.write(6, {'train_loss': 4.25})
  writer.close()
  run_log.write_status(workdir, 'finished', step=6)
  train, evals = results.read_metrics(workdir)
  assert [(record['step'], record['train_loss']) for record in train] == [(2, 4.8), (4, 4.6), (6, 4.25)]
  assert [record['step'] for record in evals] == [4]
  assert sweeps.read_status(workdir)['state'] == 'finished'
  assert json.loads((bucket / 'sweep/norm=rms/status.json').read_text())['step'] == 6
  assert sorted(path.name for path in (bucket / 'sweep/norm=rms').iterdir()) == ['metrics.jsonl',
                                                                               'status.json']


def test_config_source_and_lock_of_a_run_on_a_bucket(bucket):
  workdir = f'{BUCKET}/run'
  from configs import smoke  # pylint: disable=import-outside-toplevel
  config = smoke.get_config()
  run_dir.write_config(workdir, config)
  run_dir.write_source(workdir, 'abc')
  assert run_dir.read_config(workdir) == run_dir.resolved_config(config)
  with pytest.raises(run_dir.RunFolderError, match='raw data files'):
    run_dir.check_source(workdir, 'other')
  config.model.d_model = 64
  with pytest.raises(run_dir.RunFolderError, match='model.d_model: 32 in the run, 64 now'):
    run_dir.check_resume(workdir, config)
  with run_dir.RunLock(workdir):  # object storage has no lock: nothing is taken or written
    pass
  assert not (bucket / 'run' / run_dir.LOCK_FILE).exists()


def test_library_log_on_a_bucket_is_buffered_and_written_whole(bucket):
  handler = run_log.add_library_log_file(f'{BUCKET}/run/train.log')
  try:
    logging.getLogger('seq2seq_lab_test').warning('first record')
    logging.getLogger('seq2seq_lab_test').warning('second record')
  finally:
    logging.getLogger().removeHandler(handler)
    handler.close()
  lines = (bucket / 'run/train.log').read_text().splitlines()
  assert [line.split('] ')[-1] for line in lines] == ['first record', 'second record']


def test_sweep_record_plan_and_report_on_a_bucket(bucket):
  workdir = f'{BUCKET}/sweep'
  spec = f'{REPO}/configs/sweeps/xiong2020.py:norm'
  runs = sweeps.expand(spec, workdir)
  sweeps.write_sweep_json(workdir, spec, [], runs)
  assert sweeps.read_sweep_json(workdir)['fields'] == ['model.norm']
  finished, started = (epath.Path(workdir) / runs[0].name, epath.Path(workdir) / runs[1].name)
  for folder, state, step in ((finished, 'finished', 500), (started, 'stopped', 200)):
    (folder / 'checkpoints').mkdir(parents=True)
    (folder / 'config.json').write_text(json.dumps(run_dir.resolved_config(runs[0].config)))
    (folder / 'metrics.jsonl').write_text(json.dumps({'step': step, 'train_loss': 3.0}) + '\n')
    run_log.write_status(os.fspath(folder), state, step=step)
  plans = [sweeps.plan(os.fspath(epath.Path(workdir) / run.name), run.config, rerun_diverged=False)
           for run in runs]
  assert plans == ['skip', 'resume', 'start', 'start']
  written = report.write_report(workdir, f'{BUCKET}/report')
  assert [os.path.basename(path) for path in written[:2]] == ['report.md', 'report.csv']
  assert '| norm=layer |' in (bucket / 'report/report.md').read_text().replace('`', '')
  assert all((bucket / 'report' / os.path.basename(path)).stat().st_size > 0 for path in written)


@pytest.mark.parametrize('program', ['scripts.report', 'scripts.sweep'])
def test_a_bucket_this_python_cannot_reach_is_refused_in_one_line(program):
  if importlib.util.find_spec('gcsfs'):
    pytest.skip('gcsfs is installed: gs:// would go to the network')
  args = ['gs://bucket/sweep'] if program == 'scripts.report' else [
      'configs/sweeps/xiong2020.py:norm', '--workdir=gs://bucket/sweep']
  result = subprocess.run([sys.executable, '-m', program, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 1
  [line] = result.stderr.strip().splitlines()
  assert line.startswith(f'{program.split(".")[1]}.py: gs://bucket/sweep: ')
  assert line.endswith('(pip install gcsfs google-cloud-storage; see docs/scaling.md)')
