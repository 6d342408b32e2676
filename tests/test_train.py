"""train.py end to end on the smoke config: records, resume, divergence, bad input, sharding."""

import gzip
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import smoke
from data import datasets
from data import tokenizer as tokenizer_lib
from evaluation import translating
from training import run_log, stepping, time_budget, trainer
from training.checkpointing import Checkpointer

REPO = Path(__file__).resolve().parents[1]


def smoke_config(cache_dir, **train_overrides):
  config = smoke.get_config()
  config.data.cache_dir = str(cache_dir)
  config.train.update(train_overrides)
  return config


def read_jsonl(path):
  return [json.loads(line) for line in open(path)]


def params_equal_bitwise(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory, data_cache):
  workdir = tmp_path_factory.mktemp('smoke')
  config = smoke_config(data_cache, num_steps=20, log_every=5, eval_every=10, checkpoint_every=10)
  state = trainer.train_and_evaluate(config, str(workdir))
  return workdir, config, state


def test_run_writes_metrics_status_config_and_checkpoints(finished_run):
  workdir, config, state = finished_run
  assert int(state.step) == 20
  records = read_jsonl(workdir / 'metrics.jsonl')
  train_records = [r for r in records if 'train_loss' in r]
  assert [r['step'] for r in train_records] == [5, 10, 15, 20]
  for record in train_records:
    assert {'epoch', 'train_loss', 'learning_rate', 'grad_norm', 'tokens_per_sec'} <= set(record)
    assert np.isfinite(record['train_loss']) and record['tokens_per_sec'] > 0
  # Warmup of 10 steps to 3e-3: the rate logged at step 5 is the one used by the 5th update.
  assert train_records[0]['learning_rate'] == pytest.approx(3e-3 * 4 / 10)
  eval_records = [r for r in records if 'eval_loss' in r]
  assert [r['step'] for r in eval_records] == [10, 20]
  for record in eval_records:
    assert record['eval_ppl'] == pytest.approx(np.exp(record['eval_loss']), rel=1e-6)
    assert 0.0 <= record['bleu'] <= 100.0
  assert eval_records[1]['eval_loss'] < eval_records[0]['eval_loss']
  assert json.load(open(workdir / 'status.json'))['state'] == 'finished'
  assert json.load(open(workdir / 'config.json'))['model']['d_model'] == 32
  assert (workdir / 'tokenizer.model').read_bytes() == open(
      tokenizer_lib.get_tokenizer(datasets.resolve(config.data)).model_path, 'rb').read()
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['10', '20']
  assert any(name.startswith('events.out.tfevents') for name in os.listdir(workdir))


def assert_resume_reproduces(config, workdir, stop_after_steps, uninterrupted, uninterrupted_dir):
  """A run stopped after `stop_after_steps` and resumed ends bitwise where `uninterrupted` did."""
  trainer.train_and_evaluate(config, workdir, stop_after_steps=stop_after_steps)
  assert json.load(open(os.path.join(workdir, 'status.json')))['state'] == 'running'
  resumed = trainer.train_and_evaluate(config, workdir)
  assert int(resumed.step) == int(uninterrupted.step) == config.train.num_steps
  assert params_equal_bitwise(resumed.params, uninterrupted.params)
  assert params_equal_bitwise(resumed.opt_state, uninterrupted.opt_state)
  assert_same_records(workdir, uninterrupted_dir)


def assert_same_records(workdir, uninterrupted_dir):
  """Each step's records once, in order, with the uninterrupted run's losses (redone steps too)."""
  records = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  expected = read_jsonl(os.path.join(uninterrupted_dir, 'metrics.jsonl'))
  kinds = lambda records: [(r['step'], sorted(r)) for r in records]
  assert kinds(records) == kinds(expected)
  assert [r.get('train_loss') for r in records] == [r.get('train_loss') for r in expected]


def test_resumed_run_equals_uninterrupted_run_bitwise(finished_run, tmp_path):
  workdir, config, uninterrupted = finished_run
  # Killed 6 steps after the step-10 checkpoint, after the step-15 record: those 6 steps are lost
  # and redone on resume.
  assert_resume_reproduces(config, str(tmp_path / 'killed'), 16, uninterrupted, workdir)


def budget_test_config(cache_dir, **train):
  """Packed smoke rows, cosine after 20 warmup steps: the shape of the hour presets, in seconds."""
  config = smoke_config(cache_dir, log_every=4, eval_every=100, checkpoint_every=100, **train)
  config.data.update(pack_length=16, eval_examples=8)
  config.optim.update(schedule='cosine', warmup_steps=20)
  return config


def step_traces_during(function) -> int:
  """How many times the training step is traced while `function()` runs."""
  traces = []

  def listen(event, seconds, **fields):
    # jax's event for each tracing of a jitted function (jax._src.dispatch.JAXPR_TRACE_EVENT).
    if event == '/jax/core/compile/jaxpr_trace_duration' and fields.get('fun_name') == 'step_and_accumulate':
      traces.append(seconds)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    function()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  return len(traces)


def test_a_budgeted_run_trains_the_length_it_planned_at_warmup_end_and_keeps_it_on_resume(
    tmp_path, data_cache, monkeypatch):
  # The plan's arithmetic is tests/test_time_budget.py's; here it is fixed at 26 steps of at most
  # 40, and the run must equal one told num_steps=26 from the start: its cosine reaches 0 at 26,
  # not 40, although its first 20 steps (warmup) ran before the plan. Its rows are packed, as the
  # Multi30k presets' are, so this is also the test that a resumed run rebuilds the same rows.
  fixed = trainer.train_and_evaluate(budget_test_config(data_cache, num_steps=26), str(tmp_path / 'fixed'))
  plans = []

  def plan_length(costs, **inputs):
    plans.append((costs, inputs))
    return 26

  monkeypatch.setattr(time_budget, 'plan_length', plan_length)
  budgeted = budget_test_config(data_cache, num_steps=40, time_budget_minutes=60.0)
  workdir = str(tmp_path / 'budgeted')
  # Stopped 3 steps after the plan and its checkpoint (step 20): resumed, it trains to 26, not 40,
  # without planning again.
  # `fixed` traced the same step and decoder: start afresh, so this run compiles its own.
  stepping.jitted_step_functions.cache_clear()
  translating._search_per_device.cache_clear()
  step_traces = step_traces_during(
      lambda: trainer.train_and_evaluate(budgeted, workdir, stop_after_steps=23))
  # The planned length is an argument of the compiled step: once per batch shape, none for the plan.
  shapes = [r['compiled_shapes'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
            if 'compiled_shapes' in r]
  assert step_traces == shapes[-1] >= 1
  resumed = trainer.train_and_evaluate(budgeted, workdir)
  (costs, inputs), = plans
  assert inputs['step'] == 20 and inputs['max_steps'] == 40 and inputs['budget_seconds'] == 3600
  assert costs.step_seconds > 0 and costs.eval_seconds > 0 and costs.save_seconds > 0
  assert inputs['elapsed_seconds'] > 0
  assert int(resumed.step) == 26
  assert params_equal_bitwise(resumed.params, fixed.params)
  assert params_equal_bitwise(resumed.opt_state, fixed.opt_state)
  records = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in records if 'planned_steps' in r] == [20]
  # The plan's validation is timed without the decoder's first compilation, which it records apart.
  plan, = [r for r in records if 'planned_steps' in r]
  assert plan['eval_compile_seconds'] > 0 and plan['planned_from_eval_seconds'] == costs.eval_seconds
  assert [r['step'] for r in records if 'eval_loss' in r] == [20, 26]
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['20', '26']


def test_a_later_plan_moves_the_end_stretches_the_rest_of_the_schedule_and_survives_resume(
    tmp_path, data_cache, monkeypatch):
  # Plans fixed by step: 32 at warmup's end (20), then 36 at the validation of step 30, ten steps
  # after the first plan. A run stopped at step 33 resumes from the step-30 checkpoint, reads the
  # later plan back and ends bitwise where the uninterrupted run did.
  ends = {20: 32, 30: 36}
  plans = []

  def plan_length(costs, **inputs):
    plans.append(inputs['step'])
    return ends[inputs['step']]

  monkeypatch.setattr(time_budget, 'plan_length', plan_length)
  config = budget_test_config(data_cache, num_steps=40, time_budget_minutes=60.0)
  config.train.update(eval_every=15, checkpoint_every=15)
  uninterrupted = trainer.train_and_evaluate(config, str(tmp_path / 'uninterrupted'))
  assert int(uninterrupted.step) == 36 and plans == [20, 30]
  records = read_jsonl(tmp_path / 'uninterrupted' / 'metrics.jsonl')
  later = [r for r in records if 'planned_steps' in r][1]
  assert (later['step'], later['planned_steps']) == (30, 36)
  assert [later[f'schedule_{name}'] for name in ('horizon', 'revised_at', 'revised_from', 'last_step')] == [32, 30, 30.0, 36]
  # The logged rate is the one the step's update used (count = step - 1): the cosine made for 32
  # steps (warmup 20) until step 30, then its rest spread over steps 30-36.
  peak = config.optim.learning_rate
  cosine = lambda position: peak * 0.5 * (1 + np.cos(np.pi * (position - 20) / (32 - 20)))
  rates = {r['step']: r['learning_rate'] for r in records if 'learning_rate' in r}
  assert rates[28] == pytest.approx(cosine(27), rel=1e-5)
  for step in (32, 36):
    assert rates[step] == pytest.approx(cosine(30 + (step - 1 - 30) * (32 - 30) / (36 - 30)), rel=1e-5)
  assert sorted(os.listdir(tmp_path / 'uninterrupted' / 'checkpoints')) == ['30', '36']  # keeps 2

  workdir = str(tmp_path / 'resumed')
  trainer.train_and_evaluate(config, workdir, stop_after_steps=33)
  resumed = trainer.train_and_evaluate(config, workdir)
  assert plans == [20, 30, 20, 30]  # the resumed invocation planned nothing
  assert int(resumed.step) == 36
  assert params_equal_bitwise(resumed.params, uninterrupted.params)
  assert params_equal_bitwise(resumed.opt_state, uninterrupted.opt_state)
  assert_same_records(workdir, tmp_path / 'uninterrupted')


def test_a_run_behind_its_budget_ends_early_with_a_validation_and_a_checkpoint(
    tmp_path, data_cache, monkeypatch):
  # A plan of all 40 steps against a budget of 0.6 s, spent before the plan: at the first log step
  # after it (24) the clock ends the run, which validates, saves and records the shortened plan.
  monkeypatch.setattr(time_budget, 'plan_length', lambda costs, **inputs: inputs['max_steps'])
  config = budget_test_config(data_cache, num_steps=40, time_budget_minutes=0.01)
  workdir = tmp_path / 'run'
  assert int(trainer.train_and_evaluate(config, str(workdir)).step) == 24
  records = read_jsonl(workdir / 'metrics.jsonl')
  assert [(r['step'], r['planned_steps']) for r in records if 'planned_steps' in r] == [(20, 40), (24, 24)]
  assert [r['step'] for r in records if 'eval_loss' in r] == [20, 24]
  status = json.load(open(workdir / 'status.json'))
  assert (status['state'], status['step']) == ('finished', 24)
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['20', '24']
  # The same command again: the run is finished at 24, not resumed towards the first plan's 40.
  assert int(trainer.train_and_evaluate(config, str(workdir)).step) == 24
  assert len(read_jsonl(workdir / 'metrics.jsonl')) == len(records)


def test_divergence_stops_cleanly_and_keeps_the_last_good_checkpoint(tmp_path, data_cache):
  config = smoke_config(data_cache, num_steps=20, checkpoint_every=1, log_every=1, eval_every=100)
  config.optim.update(learning_rate=1e30, warmup_steps=0, schedule='constant')
  workdir = str(tmp_path / 'diverged')
  with pytest.raises(run_log.DivergenceError) as error:
    trainer.train_and_evaluate(config, workdir)
  status = json.load(open(os.path.join(workdir, 'status.json')))
  assert status['state'] == 'diverged' and status['step'] == error.value.step
  assert f'step {error.value.step}' in str(error.value)
  checkpoints = Checkpointer(workdir, keep=1, save_every=1)
  assert checkpoints.latest_step() == error.value.step - 1
  checkpoints.close()


def run_train_cli(*args, env=None):
  return subprocess.run([sys.executable, 'train.py', *args], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.parametrize('args,expected', [
    (['--config=configs/nonexistent.py'], 'nonexistent.py'),
    (['--config=configs/smoke.py', '--config.model.nrom=rms'], 'nrom'),
    (['--config=configs/smoke.py', '--config.model.norm=group'],
     "config.model.norm='group' is not one of: batch, layer, rms, scale"),
])
def test_bad_command_lines_fail_with_one_clear_line(tmp_path, args, expected):
  result = run_train_cli(f'--workdir={tmp_path}/run', *args)
  assert result.returncode != 0
  assert expected in result.stderr.strip().splitlines()[-1]
  assert 'Compiling' not in result.stderr


def test_the_console_shows_its_lines_and_library_logging_goes_to_train_log(tmp_path, data_cache):
  # Not a terminal (captured): no bar, a plain line per logged record.
  workdir = tmp_path / 'run'
  result = run_train_cli(f'--workdir={workdir}', '--config=configs/smoke.py',
                         f'--config.data.cache_dir={data_cache}', '--config.train.num_steps=4',
                         '--config.train.log_every=2', '--config.train.eval_every=4',
                         '--config.train.checkpoint_every=4', env={'CI': ''})
  assert result.returncode == 0, result.stderr[-2000:]
  lines = (result.stdout + result.stderr).splitlines()
  starts = [line.split(' ')[0] for line in lines]
  assert starts == ['preparing', 'data:', 'model:', 'step', 'step', 'step', 'finished'], lines
  assert lines[3].startswith('step 2/4: epoch=0, loss=') and 'ETA' in lines[3]
  assert lines[5].startswith('step 4: validation loss')
  assert lines[6].startswith('finished at step 4') and str(workdir) in lines[6]
  log = (workdir / 'train.log').read_text()
  assert 'train step compiled for batch shape' in log and 'config:' in log
  # tests/conftest.py names the session's compilation cache in $JAX_COMPILATION_CACHE_DIR: train.py
  # compiled into it, not into the data cache's own folder.
  assert not (data_cache / 'xla').exists()


def test_an_explicit_jax_compilation_cache_dir_wins_over_the_data_caches_folder(data_cache, monkeypatch):
  config = smoke_config(data_cache)
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/elsewhere/xla')
  assert datasets.compilation_cache_dir(config.data) == Path('/elsewhere/xla')
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR')
  assert datasets.compilation_cache_dir(config.data) == data_cache / 'xla'


def test_a_whole_epoch_records_its_wall_clock_time(tmp_path, data_cache):
  config = smoke_config(data_cache, num_epochs=1, log_every=10, eval_every=10**6,
                        checkpoint_every=10**6)
  config.data.train_max_source_words = 5  # a short epoch: the ~800 shortest pairs
  start = time.perf_counter()
  state = trainer.train_and_evaluate(config, str(tmp_path))
  wall_seconds = time.perf_counter() - start
  records = read_jsonl(tmp_path / 'metrics.jsonl')
  (epoch_record,) = [r for r in records if 'epoch_finished' in r]
  assert epoch_record['epoch_finished'] == 0 and epoch_record['step'] == int(state.step)
  # Everything from the epoch's first batch to its end, within the whole call's time.
  assert 0 < epoch_record['epoch_seconds'] < wall_seconds
  assert {r['epoch'] for r in records if 'train_loss' in r} == {0}


def test_status_json_follows_the_run_at_every_logged_step(tmp_path, data_cache):
  config = smoke_config(data_cache, num_steps=20, log_every=2, eval_every=20, checkpoint_every=20)
  trainer.train_and_evaluate(config, str(tmp_path / 'run'), stop_after_steps=5)
  status = json.loads((tmp_path / 'run' / 'status.json').read_text())
  assert (status['state'], status['step']) == ('running', 4)  # the last logged step


def test_the_mixed_shapes_notice_counts_the_batches_off_the_main_shape_and_names_each_cost():
  shapes = {(110, 32): 141, (73, 48): 7, (55, 64): 1, (40, 80): 0}
  grouped = stepping.mixed_shapes_notice(shapes, steps_per_call=8, members=1, max_length=64)
  assert grouped.startswith('8 of the 149 batches an epoch are not [110, 32]: a group of '
                            'train.steps_per_call steps ends at each of them, ')
  assert grouped.endswith('(data.pack_length=64 packs every pair into one shape)')
  together = stepping.mixed_shapes_notice(shapes, steps_per_call=1, members=3, max_length=64)
  assert "members' batches differ in shape" in together and 'steps_per_call' not in together
  # Nothing to say: one step at a time, or one shape (an empty bucket is no shape).
  assert stepping.mixed_shapes_notice(shapes, steps_per_call=1, members=1, max_length=64) is None
  assert stepping.mixed_shapes_notice({(55, 64): 142, (110, 32): 0}, 8, 3, 64) is None


def test_steps_per_call_trains_bitwise_as_one_step_per_call_and_resumes_exactly(
    tmp_path, data_cache, caplog):
  """Packed rows, so most consecutive batches share a shape and go 4 to a dispatch; records,
  validation and checkpoints land on the same steps, and a run killed mid-way resumes exactly."""
  def config(steps_per_call):
    config = smoke_config(data_cache, num_steps=20, log_every=5, eval_every=10, checkpoint_every=10,
                          steps_per_call=steps_per_call)
    config.data.update(pack_length=16, eval_examples=8)
    return config

  single_dir = str(tmp_path / 'single')
  single = trainer.train_and_evaluate(config(1), single_dir)
  with caplog.at_level(logging.INFO):
    grouped = trainer.train_and_evaluate(config(4), str(tmp_path / 'grouped'))
  assert 'train step compiled for batch shape (4, ' in caplog.text  # the scan ran
  assert params_equal_bitwise(grouped.params, single.params)
  assert params_equal_bitwise(grouped.opt_state, single.opt_state)
  assert_same_records(str(tmp_path / 'grouped'), single_dir)
  assert sorted(os.listdir(tmp_path / 'grouped' / 'checkpoints')) == ['10', '20']
  # Killed after 7 steps (4 in one dispatch, 1 to the step-5 record, 2 more), resumed from step 0.
  assert_resume_reproduces(config(4), str(tmp_path / 'killed'), 7, single, single_dir)


def test_a_run_after_another_reuses_its_traced_step_and_trains_as_it_would_alone(
    tmp_path, data_cache):
  """Seed, peak rate and warmup are the step's arguments: a run that differs from the one before
  it only in them traces nothing, and its parameters equal bitwise those of the same run traced
  afresh (so no value of the first run is baked into the shared program)."""
  def config(seed, learning_rate, warmup_steps):
    config = smoke_config(data_cache, num_steps=12, log_every=6, eval_every=12,
                          checkpoint_every=12, seed=seed)
    config.optim.update(learning_rate=learning_rate, warmup_steps=warmup_steps)
    config.data.update(eval_examples=8)
    return config

  states = {}
  train = lambda name, config: states.setdefault(
      name, trainer.train_and_evaluate(config, str(tmp_path / name)))
  stepping.jitted_step_functions.cache_clear()
  train('first', config(0, 3e-3, 10))
  second = config(1, 6e-3, 4)
  assert step_traces_during(lambda: train('after', second)) == 0
  stepping.jitted_step_functions.cache_clear()
  assert step_traces_during(lambda: train('alone', second)) >= 1
  assert int(states['after'].step) == 12
  assert params_equal_bitwise(states['after'].params, states['alone'].params)
  assert params_equal_bitwise(states['after'].opt_state, states['alone'].opt_state)
  assert_same_records(str(tmp_path / 'after'), str(tmp_path / 'alone'))


def test_step_settings_leave_out_only_the_steps_arguments(data_cache):
  base = smoke_config(data_cache)
  steps = stepping.RunSteps(steps_per_epoch=100, max_steps=40)
  settings = lambda config: stepping.StepSettings.of(config, steps, microbatch_tokens=512)
  other_arguments = smoke_config(data_cache, seed=7, num_steps=80)
  other_arguments.optim.update(learning_rate=1e-2, warmup_steps=4)
  assert settings(other_arguments) == settings(base)
  smoothed = smoke_config(data_cache, label_smoothing=0.0)
  other_betas = smoke_config(data_cache)
  other_betas.optim.b2 = 0.999
  assert len({settings(config) for config in (base, smoothed, other_betas)}) == 3
  for argument in ('learning_rate', 'warmup_steps'):  # each run's own, the step's arguments
    with pytest.raises(AttributeError):
      getattr(settings(base).optim_config(), argument)


def traced_events(workdir) -> list[dict]:
  """The complete events of the run's one jax.profiler trace."""
  [trace] = Path(workdir, 'profile').glob('**/perfetto_trace.json.gz')
  with gzip.open(trace) as file:
    events = json.load(file)
  return [event for event in events.get('traceEvents', events) if event.get('ph') == 'X']


def test_profile_steps_trace_exactly_their_steps_and_leave_the_training_unchanged(
    tmp_path, data_cache, capsys):
  """Every pair in one shape, 4 steps a dispatch, records every 5: the trace of steps 6-9 holds
  their one group dispatch and no single step, record or validation, and the run trains bitwise
  as without it. A trace longer than the run stops at its last step, before the final
  validation; a run over before the trace's first step says it took none."""
  def config(profile_steps):
    config = smoke_config(data_cache, num_steps=12, log_every=5, eval_every=10,
                          checkpoint_every=10, steps_per_call=4, profile_steps=profile_steps)
    config.data.update(pack_length=32, eval_examples=8)
    return config

  def calls(workdir):
    return {event['name'] for event in traced_events(workdir)
            if event['name'].startswith('PjitFunction(')}

  plain = trainer.train_and_evaluate(config(0), str(tmp_path / 'plain'))
  profiled = trainer.train_and_evaluate(config(4), str(tmp_path / 'profiled'))
  assert params_equal_bitwise(profiled.params, plain.params)
  assert params_equal_bitwise(profiled.opt_state, plain.opt_state)
  assert_same_records(str(tmp_path / 'profiled'), str(tmp_path / 'plain'))
  assert 'profile of steps 6-9 written to ' in capsys.readouterr().err
  assert 'PjitFunction(steps_and_accumulate)' in calls(tmp_path / 'profiled')
  assert not {'PjitFunction(step_and_accumulate)', 'PjitFunction(eval_step)'} & calls(
      tmp_path / 'profiled')
  assert not (tmp_path / 'plain' / 'profile').exists()
  long_trace = config(100)
  long_trace.train.eval_every = 12  # validation only after the last step
  trainer.train_and_evaluate(long_trace, str(tmp_path / 'long_trace'))
  assert 'profile of steps 6-12 written to ' in capsys.readouterr().err
  assert 'PjitFunction(step_and_accumulate)' in calls(tmp_path / 'long_trace')  # steps 10-12
  assert 'PjitFunction(eval_step)' not in calls(tmp_path / 'long_trace')
  short_run = config(4)
  short_run.train.num_steps = 5  # over before the first record's step, where the trace starts
  trainer.train_and_evaluate(short_run, str(tmp_path / 'short_run'))
  assert ('no profile: training stopped at step 5, and the trace (train.profile_steps) was to '
          'hold steps 6-9') in capsys.readouterr().err
