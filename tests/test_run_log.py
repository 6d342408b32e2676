"""metrics.jsonl and TensorBoard records, status.json, the progress bar, divergence."""

import io
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from training import run_log


def test_metrics_jsonl_records(tmp_path):
  writer = run_log.MetricsWriter(str(tmp_path), is_primary=True)
  writer.write(10, {'train/loss': jnp.float32(2.5), 'lr': 1e-3, 'tokens': np.int64(4096)})
  writer.write(20, {'train/loss': 1.25})
  # Flushed per write: readable while the run is still going.
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  writer.close()
  records = [json.loads(line) for line in lines]
  assert records == [
      {'step': 10, 'train/loss': 2.5, 'lr': 1e-3, 'tokens': 4096},
      {'step': 20, 'train/loss': 1.25},
  ]
  assert isinstance(records[0]['tokens'], int)


def test_metrics_appends_on_resume(tmp_path):
  for step in (1, 2):
    writer = run_log.MetricsWriter(str(tmp_path), is_primary=True, start_step=step - 1)
    writer.write(step, {'loss': float(step)})
    writer.close()
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  assert [json.loads(line)['step'] for line in lines] == [1, 2]


def test_a_resumed_run_drops_the_records_after_its_checkpoint(tmp_path):
  writer = run_log.MetricsWriter(str(tmp_path), is_primary=True)
  for step in (5, 10, 15):
    writer.write(step, {'loss': float(step)})
  writer.write(10, {'eval_loss': 1.0})
  writer.close()
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 20, "lo')  # killed mid-write
  # Restored from the step-10 checkpoint: 15 and the cut line go, step 10's records stay.
  writer = run_log.MetricsWriter(str(tmp_path), is_primary=True, start_step=10)
  writer.write(15, {'loss': 15.5})
  writer.close()
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert records == [{'step': 5, 'loss': 5.0}, {'step': 10, 'loss': 10.0},
                     {'step': 10, 'eval_loss': 1.0}, {'step': 15, 'loss': 15.5}]


def test_tensorboard_reads_the_scalars_and_drops_those_after_a_resumed_checkpoint(tmp_path):
  """TensorBoard's own reader (what `tensorboard --logdir` shows): a run resumed from step 10
  replaces the step-15 value the killed invocation had written."""
  writer = run_log.MetricsWriter(str(tmp_path), is_primary=True)
  for step in (5, 10, 15):
    writer.write(step, {'loss': float(step)})
  writer.close()
  writer = run_log.MetricsWriter(str(tmp_path), is_primary=True, start_step=10)
  writer.write(15, {'loss': 15.5, 'bleu': 20.0})
  writer.close()
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert sorted(events.Tags()['scalars']) == ['bleu', 'loss']
  assert [(event.step, event.value) for event in events.Scalars('loss')] == [
      (5, 5.0), (10, 10.0), (15, 15.5)]


def test_non_primary_writes_nothing(tmp_path):
  workdir = tmp_path / 'run'
  writer = run_log.MetricsWriter(str(workdir), is_primary=False)
  writer.write(1, {'loss': 3.0})
  writer.close()
  assert not workdir.exists()


def test_status_is_replaced_whole(tmp_path):
  run_log.write_status(str(tmp_path), 'running', step=5, message='training')
  first = json.loads((tmp_path / 'status.json').read_text())
  assert first['state'] == 'running' and first['step'] == 5
  assert first['message'] == 'training' and first['updated'].endswith('+00:00')

  run_log.write_status(str(tmp_path), 'finished', step=100)
  second = json.loads((tmp_path / 'status.json').read_text())
  assert second['state'] == 'finished' and second['step'] == 100
  assert 'message' not in second
  assert os.listdir(tmp_path) == ['status.json']


def test_invalid_status_raises(tmp_path):
  with pytest.raises(ValueError, match="'done' is not one of: running, finished"):
    run_log.write_status(str(tmp_path), 'done')
  assert not (tmp_path / 'status.json').exists()


class _Terminal(io.StringIO):

  def isatty(self):
    return True


def _draw(stream, steps=4):
  console = run_log.Console(file=stream)
  console.line('data: ready')
  console.start(total_steps=steps, initial_step=0)
  for step in range(1, steps + 1):
    if step % 2:
      console.step(step)
    else:
      console.update(step, 1.5 * (steps - step), loss=jnp.float32(2.3456), lr=1e-3, tok_s=12345.0)
  console.close()
  return stream.getvalue()


def test_console_draws_a_bar_on_a_terminal(monkeypatch):
  monkeypatch.delenv('CI', raising=False)
  output = _draw(_Terminal())
  assert 'data: ready\n' in output
  assert '4/4' in output and 'loss=2.35, lr=0.001, tok_s=12345.0, ETA 00:00' in output


@pytest.mark.parametrize('stream, ci', [(_Terminal, 'true'), (io.StringIO, None)])
def test_console_prints_plain_lines_under_ci_and_off_a_terminal(monkeypatch, stream, ci):
  if ci:
    monkeypatch.setenv('CI', ci)
  else:
    monkeypatch.delenv('CI', raising=False)
  lines = _draw(stream()).splitlines()
  # No bar: the lines and one line per logged record, with an ETA.
  assert lines[0] == 'data: ready'
  assert [line.split(':')[0] for line in lines[1:]] == ['step 2/4', 'step 4/4']
  assert lines[1] == 'step 2/4: loss=2.35, lr=0.001, tok_s=12345.0, ETA 00:03'
  assert lines[2].endswith('ETA 00:00')


def test_a_length_not_yet_planned_has_no_eta_until_it_is_set(monkeypatch):
  monkeypatch.setenv('CI', 'true')
  stream = io.StringIO()
  console = run_log.Console(file=stream)
  console.start(total_steps=None)  # a time budget plans the length at the end of warmup
  console.update(2, 30.0, loss=2.5)
  console.set_total(6)
  console.update(4, 12.0, loss=2.0)
  console.close()
  lines = stream.getvalue().splitlines()
  assert lines[0] == 'step 2: loss=2.5'
  assert lines[1] == 'step 4/6: loss=2, ETA 00:12'
