"""Raw parallel text on disk: where it lives, and reading it with checks.

The builders call these before writing anything, so a missing file, a bad byte
or a misaligned pair stops preparation with a one-line message that names the
file (and line) instead of producing a silently shorter dataset.
"""

import gzip
import os
from pathlib import Path
from typing import Mapping, Sequence
import urllib.request
import zlib

from absl import logging

# Root holding one subfolder per dataset (`multi30k/`, `iwslt14/`).
ENV_VAR = 'SEQ2SEQ_DATA_DIR'


class SourceError(ValueError):
  """Raw files exist but cannot be used as they are."""


class MissingSourceError(SourceError, FileNotFoundError):
  """A raw folder or file is absent."""


def resolve_source_dir(source_dir: str, dataset: str) -> Path | None:
  """Returns the folder holding `dataset`'s raw files, or None to download.

  Args:
    source_dir: `config.data.source_dir`; wins over the environment variable.
    dataset: Dataset name, the subfolder looked up under `$SEQ2SEQ_DATA_DIR`.

  Raises:
    MissingSourceError: The configured folder does not exist; falling back to
      a download would hide a typo.
  """
  if source_dir:
    folder, origin = Path(source_dir).expanduser(), 'config.data.source_dir'
  elif os.environ.get(ENV_VAR):
    folder = Path(os.environ[ENV_VAR]).expanduser() / dataset
    origin = f'${ENV_VAR}/{dataset}'
  else:
    return None
  if not folder.is_dir():
    raise MissingSourceError(
        f'{dataset}: source folder {folder} (from {origin}) does not exist')
  return folder


def find_file(folder: Path, name: str) -> Path | None:
  """Returns `folder/name.gz` or `folder/name`, whichever exists."""
  for candidate in (folder / f'{name}.gz', folder / name):
    if candidate.is_file():
      return candidate
  return None


def require_files(folder: Path, names: Sequence[str], dataset: str,
                  hint: str = '') -> dict[str, Path]:
  """Finds every file of `names` (each gzipped or not) or raises for all missing.

  Args:
    folder: Where to look.
    names: File names relative to `folder`, without .gz.
    dataset: Dataset name, for the message.
    hint: Appended to the message (another way to provide the data).

  Returns:
    Each name mapped to the path found.
  """
  found = {name: find_file(folder, name) for name in names}
  missing = [f'{name}.gz' for name, path in found.items() if path is None]
  if missing:
    raise MissingSourceError(
        f'{dataset}: {folder} lacks {len(missing)} file(s): '
        f'{", ".join(missing)} (plain-text versions without .gz also work'
        f'{"; " + hint if hint else ""})')
  return found


def decode_lines(data: bytes, label: str) -> list[str]:
  """Splits UTF-8 `data` into lines, without the newlines.

  Only '\\n' separates lines: `str.splitlines` would also split at U+2028 and
  friends, which can occur inside a sentence.

  Args:
    data: File content.
    label: How errors name the file.

  Raises:
    SourceError: The file is empty or not valid UTF-8.
  """
  if not data.strip():
    raise SourceError(f'{label} is empty')
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    line = data.count(b'\n', 0, e.start) + 1
    raise SourceError(
        f'{label}: line {line} is not valid UTF-8 ({e.reason})') from None
  lines = text.split('\n')
  if lines[-1] == '':
    lines.pop()
  return lines


def read_lines(path: Path) -> list[str]:
  """Reads a text file, gzipped when its name ends in .gz (see decode_lines).

  Raises:
    SourceError: naming the file, when it is not valid gzip (truncated, corrupted).
  """
  opener = gzip.open if path.suffix == '.gz' else open
  try:
    with opener(path, 'rb') as f:
      data = f.read()
  except (EOFError, gzip.BadGzipFile, zlib.error) as error:
    raise SourceError(f'{path} is not a complete gzip file ({type(error).__name__}: {error}); '
                      'download or copy it again') from None
  return decode_lines(data, str(path))


def check_parallel(columns: Mapping[str, list[str]], *,
                   allow_empty_lines: bool = False) -> None:
  """Checks that line-aligned files agree in length and have no empty line.

  Args:
    columns: Lines of each file, keyed by how errors should name the file.
    allow_empty_lines: For raw text that a later cleaning step filters.

  Raises:
    SourceError: Naming the first offending file (and line).
  """
  (first, first_lines), *others = columns.items()
  for label, lines in others:
    if len(lines) != len(first_lines):
      raise SourceError(f'{label} has {len(lines)} lines but {first} has '
                        f'{len(first_lines)}; line i of each must translate '
                        'line i of the other')
  if allow_empty_lines:
    return
  for label, lines in columns.items():
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        raise SourceError(f'{label}: line {number} is empty')


def download(urls: Mapping[str, str], dest: Path) -> Path:
  """Downloads each `relative path: url` under `dest`, skipping files present.

  Returns:
    `dest`, laid out like a local source folder.

  Raises:
    MissingSourceError: a download failed (no network, a moved file); it names the URL and the
      two ways to read local files instead, and leaves no partial file behind.
  """
  for relative, url in urls.items():
    target = dest / relative
    if target.exists():
      continue
    target.parent.mkdir(parents=True, exist_ok=True)
    logging.info('Downloading %s to %s', url, target)
    partial = target.with_name(f'{target.name}.partial-{os.getpid()}')
    try:
      urllib.request.urlretrieve(url, partial)
    except OSError as error:  # urllib's URLError and HTTPError are OSErrors
      partial.unlink(missing_ok=True)
      reason = getattr(error, 'reason', None) or error
      raise MissingSourceError(
          f'downloading {url} failed ({reason}); to read local raw files instead, set '
          f'${ENV_VAR} to a folder with one subfolder per dataset, or config.data.source_dir'
      ) from None
    # Rename last, so an interrupted download is fetched again next time.
    os.replace(partial, target)
  return dest
