"""Everyday mistakes end in one line that names the thing and what was expected, and a run that
fails before its first step leaves its folder so that the same command works once fixed."""

import json
from pathlib import Path

import pytest

from configs import base

from training import command_line, run_dir, trainer
from tests.test_eval import eval_in_process, run_eval
from tests.test_train import run_train_cli, smoke_config

# A folder that even root cannot create anything in (sysfs), for unwritable destinations.
UNWRITABLE = Path('/sys')
needs_sysfs = pytest.mark.skipif(not (UNWRITABLE / 'kernel').is_dir(), reason='needs Linux sysfs')


@pytest.mark.parametrize('override,expected', [
    ('--config.model.bogus=1', "config.model.bogus: config.model has no field 'bogus'"),
    ('--config.model.nrom=rms',
     "config.model.nrom: config.model has no field 'nrom'; did you mean config.model.norm?"),
    ('--config.modle.norm=rms', "config.modle.norm: config has no field 'modle'; did you mean config.model?"),
    ('--config.optim.learning_rate=inf', 'config.optim.learning_rate=inf must be a finite number'),
    ('--config.optim.learning_rate=nan', 'config.optim.learning_rate=nan must be a finite number'),
    ('--config.train.label_smoothing=nan', 'config.train.label_smoothing=nan must be a finite number'),
])
def test_an_unknown_field_is_named_by_its_path_and_non_finite_numbers_are_refused(override, expected):
  with pytest.raises(ValueError) as error:
    command_line.parse_config_args(['--config=configs/smoke.py', override])
  message = str(error.value)
  assert expected in message and '\n' not in message and '\\' not in message


def test_a_run_folder_that_is_a_file_or_lies_under_one_is_one_line(tmp_path):
  file = tmp_path / 'file'
  file.write_text('')
  for workdir, expected in [(file, 'is a file or lies under one'),
                            (file / 'run', 'is a file or lies under one')]:
    with pytest.raises(run_dir.RunFolderError, match=expected):
      run_dir.make_run_folder(workdir)
  result = run_train_cli(f'--workdir={file / "run"}', '--config=configs/smoke.py')
  assert result.returncode != 0
  assert result.stderr.strip() == f'{file / "run"} is a file or lies under one: a run folder must be a folder'


@needs_sysfs
def test_a_run_folder_that_cannot_be_created_or_written_is_one_line(tmp_path):
  with pytest.raises(run_dir.RunFolderError, match='cannot create the run folder /sys/run'):
    run_dir.make_run_folder(UNWRITABLE / 'run')
  result = run_train_cli(f'--workdir={UNWRITABLE / "kernel"}', '--config=configs/smoke.py')
  assert result.returncode != 0
  assert result.stderr.strip().splitlines() == [
      'cannot write the run folder: /sys/kernel/train.log: Permission denied']


def test_a_vocabulary_size_the_data_cannot_give_is_one_line_and_the_fixed_command_then_runs(
    tmp_path, data_cache):
  """The failed start removes config.json and source.json, which would otherwise refuse the
  corrected command as a changed run; train.log keeps the traceback."""
  workdir = tmp_path / 'run'
  config = smoke_config(data_cache, num_steps=2, log_every=1, eval_every=2, checkpoint_every=2)
  config.data.vocab_size = 40
  with pytest.raises(ValueError, match=r'^config.data.vocab_size=40 is too small for this data: .* '
                                       r'need at least \d+$'):
    trainer.train_and_evaluate(config, str(workdir))
  assert sorted(path.name for path in workdir.iterdir()) == ['run.lock']
  config.data.vocab_size = smoke_config(data_cache).data.vocab_size
  trainer.train_and_evaluate(config, str(workdir))
  assert json.loads((workdir / 'status.json').read_text())['state'] == 'finished'


def test_eval_input_and_output_failures_are_one_line_before_the_model_loads(tmp_path, data_cache):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  run_dir.write_config(workdir, smoke_config(data_cache))  # no checkpoint: loading would fail
  missing = tmp_path / 'missing.txt'
  # As the program prints it, then the other failures of the same function in this process.
  result = run_eval(f'--workdir={workdir}', f'--input={missing}')
  assert (result.returncode, result.stderr.strip()) == (1, f'eval.py: {missing}: No such file or directory')
  source = tmp_path / 'source.txt'
  source.write_text('Ein Hund .\n')
  assert eval_in_process(f'--workdir={workdir}', f'--input={source}', f'--output={tmp_path}') == (
      f'eval.py: {tmp_path}: Is a directory')
  assert 'no config.json in' in eval_in_process(f'--workdir={tmp_path / "absent"}', '--split=test_2016')
  if (UNWRITABLE / 'kernel').is_dir():  # a report folder that cannot be made
    assert eval_in_process(f'--workdir={workdir}', '--split=test_2016', f'--out_dir={UNWRITABLE / "eval"}') == (
        'eval.py: /sys/eval: Operation not permitted')


def test_help_lists_the_config_flag_and_helpconfig_every_field_with_its_comment():
  result = run_train_cli('--help')  # absl's --help exits with status 1
  assert '--config: Config file[:preset]' in result.stdout and '--[no]helpconfig' in result.stdout
  result = run_train_cli('--helpconfig')  # no --config or --workdir needed
  assert result.returncode == 0
  config = base.get_config()
  fields = [f'{section}.{name}' for section in config for name in config[section]]
  listed = [line.split('=')[0].strip()[len('--config.'):] for line in result.stdout.splitlines()
            if line.startswith('  --config.')]
  assert sorted(listed) == sorted(fields)
  assert '  --config.data.vocab_size=8000\n      Sentencepiece vocabulary size' in result.stdout
