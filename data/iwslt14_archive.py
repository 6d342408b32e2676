"""fairseq's IWSLT14 de-en split, rebuilt from the 2014 campaign's de-en.tgz.

Reproduces examples/translation/prepare-iwslt14.sh of fairseq up to (not
including) BPE, which gives train 160239, validation 7283, test 6750 pairs:

- train.tags.de-en.LANG: drop lines containing <url>, <talkid> or <keywords>;
  delete the <title>, </title>, <description>, </description> tags; Moses-tokenize;
  clean-corpus-n (1 to 175 tokens, length ratio at most 1.5); lowercase. Every
  23rd remaining pair (1-based) is validation, the rest train.
- test: the <seg> lines of IWSLT14.TED.dev2010, IWSLT14.TEDX.dev2012 and
  IWSLT14.TED.tst2010/2011/2012 (in that order, the script's `cat` order), with
  ’ replaced by ', Moses-tokenized and lowercased.

sacremoses stands in for Moses' tokenizer.perl (with the one rule of the perl
script it lacks, see _PerlMosesTokenizer) and Python's str.lower for
lowercase.perl.
"""

import re
import tarfile
from pathlib import Path
from typing import Sequence

from absl import logging
import sacremoses

from data import builder
from data import sources

ARCHIVE = 'de-en.tgz'
TEST_SETS = ('IWSLT14.TED.dev2010', 'IWSLT14.TEDX.dev2012',
             'IWSLT14.TED.tst2010', 'IWSLT14.TED.tst2011',
             'IWSLT14.TED.tst2012')
# clean-corpus-n.perl settings of the script (and the perl default word cap).
MIN_TOKENS, MAX_TOKENS, MAX_RATIO, MAX_WORD_CHARS = 1, 175, 1.5, 1000
VALID_EVERY = 23

_DROPPED_LINE_MARKERS = ('<url>', '<talkid>', '<keywords>')
_DELETED_TAGS = re.compile(r'</?(title|description)>')
_SEG_START = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_END = re.compile(r'\s*</seg>\s*')
_FINAL_PERIOD = re.compile(r'(\S)\.$')


def train_member(lang: str) -> str:
  return f'de-en/train.tags.de-en.{lang}'


def test_member(test_set: str, lang: str) -> str:
  return f'de-en/{test_set}.de-en.{lang}.xml'


def read_archive(path: Path, splits: Sequence[str]) -> dict:
  """Builds fairseq's tokenized, lowercased split from the archive.

  Args:
    path: The de-en.tgz file.
    splits: Splits wanted, from 'train', 'validation', 'test'.

  Returns:
    split -> language -> lines.

  Raises:
    sources.SourceError: A member is missing, undecodable or misaligned; all
      members are checked before the (slow) tokenization starts.
  """
  texts = _read_members(path)
  train = _training_lines(path, texts)
  test = _test_segments(path, texts)
  result = {}
  if {'train', 'validation'} & set(splits):
    result.update(_clean_and_split(path, train))
  if 'test' in splits:
    result['test'] = {lang: [line.lower() for line in _tokenize(lines, lang)]
                      for lang, lines in test.items()}
  return {split: result[split] for split in splits}


def _training_lines(path: Path, texts: dict[str, list[str]]) -> dict:
  """train.tags lines without the talk metadata fairseq drops."""
  train = {}
  for lang in builder.LANGUAGES:
    train[lang] = [_DELETED_TAGS.sub('', line)
                   for line in texts[train_member(lang)]
                   if not any(m in line for m in _DROPPED_LINE_MARKERS)]
  # Empty lines are legitimate here: clean-corpus-n drops them, as in fairseq.
  sources.check_parallel(
      {f'{path}:{train_member(lang)} (without <url>, <talkid>, <keywords> '
       'lines)': train[lang] for lang in builder.LANGUAGES},
      allow_empty_lines=True)
  return train


def _test_segments(path: Path, texts: dict[str, list[str]]) -> dict:
  """The <seg> text of the test sets, concatenated in TEST_SETS order."""
  test = {lang: [] for lang in builder.LANGUAGES}
  for test_set in TEST_SETS:
    segments = {lang: _segments(texts[test_member(test_set, lang)])
                for lang in builder.LANGUAGES}
    sources.check_parallel(
        {f'{path}:{test_member(test_set, lang)} (<seg> lines)': segments[lang]
         for lang in builder.LANGUAGES})
    for lang in builder.LANGUAGES:
      test[lang] += segments[lang]
  return test


def _clean_and_split(path: Path, train: dict[str, list[str]]) -> dict:
  """Tokenizes, cleans and lowercases the pairs, then splits off validation."""
  pairs = _clean(*(_tokenize(train[lang], lang) for lang in builder.LANGUAGES))
  logging.info('%s: clean-corpus-n kept %d of %d training pairs', path,
               len(pairs), len(train['de']))
  result = {'train': {lang: [] for lang in builder.LANGUAGES},
            'validation': {lang: [] for lang in builder.LANGUAGES}}
  for number, pair in enumerate(pairs, start=1):
    split = 'validation' if number % VALID_EVERY == 0 else 'train'
    for lang, side in zip(builder.LANGUAGES, pair):
      result[split][lang].append(side.lower())
  return result


def _read_members(path: Path) -> dict[str, list[str]]:
  names = [train_member(lang) for lang in builder.LANGUAGES]
  names += [test_member(test_set, lang) for test_set in TEST_SETS
            for lang in builder.LANGUAGES]
  with tarfile.open(path) as tar:
    present = set(tar.getnames())
    missing = [name for name in names if name not in present]
    if missing:
      raise sources.MissingSourceError(
          f'iwslt14: {path} lacks {len(missing)} member(s): {", ".join(missing)}')
    return {name: sources.decode_lines(tar.extractfile(name).read(),
                                       f'{path}:{name}') for name in names}


def _segments(lines: list[str]) -> list[str]:
  return [_SEG_END.sub('', _SEG_START.sub('', line)).replace('’', "'")
          for line in lines if '<seg id' in line]


class _PerlMosesTokenizer(sacremoses.MosesTokenizer):
  """sacremoses plus tokenizer.perl's "split last words independently" rule.

  tokenizer.perl always splits the period off a line's last word, even after a
  nonbreaking prefix (fairseq's IWSLT14 text has German "... ergibt 37 ."),
  where sacremoses keeps "37.".
  """

  def handles_nonbreaking_prefixes(self, text: str) -> str:
    return _FINAL_PERIOD.sub(r'\1 .', super().handles_nonbreaking_prefixes(text))


def _tokenize(lines: list[str], lang: str) -> list[str]:
  # tokenizer.perl's defaults: escape special characters, no aggressive dashes.
  tokenizer = _PerlMosesTokenizer(lang=lang)
  return [tokenizer.tokenize(line, escape=True, return_str=True)
          for line in lines]


def _clean(source: list[str], target: list[str]) -> list[tuple[str, str]]:
  """clean-corpus-n.perl: whitespace-normalised pairs within the limits.

  The script's '|' (factor) handling is omitted: the tokenizer escapes '|'.
  """
  kept = []
  for pair in zip(source, target):
    words = [side.split() for side in pair]
    counts = [len(w) for w in words]
    if min(counts) < MIN_TOKENS or max(counts) > MAX_TOKENS:
      continue
    if max(counts) / min(counts) > MAX_RATIO:
      continue
    if any(len(word) > MAX_WORD_CHARS for side in words for word in side):
      continue
    kept.append(tuple(' '.join(side) for side in words))
  return kept
