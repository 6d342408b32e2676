"""The command line every program shares: `--config=FILE[:preset]` plus `--config.x.y=value`
overrides, loaded and validated here only, and every command-line error as one line.

train.py, the analysis scripts and the benchmarks define the flag with `define_config_flag`, parse
with `parse_flags` and read the checked config with `config_from_flags`; scripts/sweep.py checks
each run's arguments with `parse_config_args`, as train.py will parse them.
"""

from pathlib import Path
import re
import sys

from absl import flags
import ml_collections
from ml_collections import config_flags


HELPCONFIG = '--helpconfig'
_BASE_CONFIG = Path(__file__).resolve().parents[1] / 'configs' / 'base.py'


def define_config_flag(default: str | None = None, *, flag_values: flags.FlagValues = flags.FLAGS,
                       sys_argv: list[str] | None = None) -> None:
  """Defines --config (and, on the global flags, --helpconfig, which parse_flags answers); `default`
  is a config file path, None makes the flag required."""
  config_flags.DEFINE_config_file(
      'config', default, 'Config file[:preset], e.g. configs/multi30k.py:en_de; any field is '
      f'overridden with --config.SECTION.FIELD=VALUE ({HELPCONFIG} lists them all).',
      flag_values=flag_values, lock_config=True, sys_argv=sys_argv)
  if default is None:
    flags.mark_flag_as_required('config', flag_values=flag_values)
  if flag_values is flags.FLAGS:
    flags.DEFINE_bool(HELPCONFIG[2:], False, 'List every config field with its default and what '
                      'it does (configs/base.py), then exit.')


def config_fields_help() -> str:
  """Every field of configs/base.py as `--config.SECTION.FIELD=DEFAULT` and its comment."""
  lines = _BASE_CONFIG.read_text(encoding='utf-8').splitlines()
  # `evaluation = config.eval = ml_collections.ConfigDict()`: the local name of each section.
  sections = dict(re.findall(r'^\s*(\w+) = config\.(\w+) = ', '\n'.join(lines), re.M))
  out = []
  for previous, line in zip(lines, lines[1:]):
    match = re.fullmatch(r'\s*(\w+)\.(\w+) = (.+)', line)
    if match and match.group(1) in sections and previous.strip().startswith('#'):
      section, name, value = sections[match.group(1)], match.group(2), match.group(3)
      out.append(f'  --config.{section}.{name}={value}\n      {previous.strip()[1:].strip()}')
  return '\n'.join(out)


def one_line_error(error: BaseException) -> str:
  """The error as one line; a traceback inside it (config_flags embeds the config file's own)
  shrinks to its last line, the exception that the config file raised."""
  text = str(error).replace('\\n', '\n')
  if 'Traceback (most recent call last)' in text:
    head, _, trace = text.partition('Traceback (most recent call last)')
    text = f'{head.strip()} {trace.strip().splitlines()[-1]}'
  return ' '.join(text.split())


def unknown_field(error: BaseException, argv: list[str]) -> str | None:
  """For an override naming no field of the config ('--config.model.bogus=1'), one line naming it
  by its path, with config_flags' suggestion where it has one; None for any other error."""
  # config_flags wraps the KeyError of the unknown key in an AttributeError.
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  if not isinstance(error, (AttributeError, KeyError)) or not error.args:
    return None
  match = re.match(r"'([^']+)'\s*(?:Did you mean \"([^\"]+)\")?", str(error.args[0]))
  if not match:
    return None
  name, suggestion = match.groups()
  for arg in argv:
    path = arg.split('=', 1)[0].lstrip('-').split('.')
    if path[0] == 'config' and name in path[1:]:
      parent = '.'.join(path[:path.index(name, 1)])
      hint = f'; did you mean {parent}.{suggestion}?' if suggestion else ''
      return f'{".".join(path)}: {parent} has no field {name!r}{hint}'
  return None


def _invalid_command_line(error: BaseException, argv: list[str]) -> str:
  return f'invalid command line: {unknown_field(error, argv) or one_line_error(error)}'


def parse_flags(argv: list[str]) -> list[str]:
  """absl parsing, with any error (missing config file, unknown override key, bad value) as one line.
  --helpconfig prints the config fields and exits, whatever else is (or is not) given."""
  if HELPCONFIG in argv:
    print(f'Config fields (override with --config.SECTION.FIELD=VALUE; presets change some '
          f'defaults):\n{config_fields_help()}')
    raise SystemExit(0)
  try:
    return flags.FLAGS(argv)
  except Exception as error:  # config_flags raises AttributeError, IOError, flags.Error, ...
    raise SystemExit(_invalid_command_line(error, argv)) from None


def _checked(flag_values: flags.FlagValues, argv: list[str]) -> ml_collections.ConfigDict:
  # Imported here: it loads JAX (through the model config), which scripts/report.py, reading
  # sweep folders through experiments/sweeps.py, has no use for.
  from training import config_checks  # pylint: disable=g-import-not-at-top
  try:
    config = flag_values.config
    config.keys()  # config_flags loads the file and applies overrides lazily, on first use
  except Exception as error:  # IOError, AttributeError (unknown key), flags.Error, ...
    raise ValueError(_invalid_command_line(error, argv)) from None
  try:
    config_checks.check_config(config)
  except ValueError as error:
    raise ValueError(f'invalid config: {error}') from None
  return config


def config_from_flags() -> ml_collections.ConfigDict:
  """The parsed --config, validated (training/config_checks.py), or SystemExit with one line."""
  try:
    return _checked(flags.FLAGS, sys.argv)
  except ValueError as error:
    raise SystemExit(str(error)) from None


def parse_config_args(args: list[str]) -> ml_collections.ConfigDict:
  """The validated config that train.py would build from `args` (other flags are ignored).

  Raises:
    ValueError: one line, as train.py would print it.
  """
  argv = ['train.py', *(arg for arg in args if arg.startswith('--config'))]
  flag_values = flags.FlagValues()
  define_config_flag(flag_values=flag_values, sys_argv=argv)
  try:
    flag_values(argv)
  except Exception as error:  # flags.Error, AttributeError, IOError, ...
    raise ValueError(_invalid_command_line(error, argv)) from None
  return _checked(flag_values, argv)
