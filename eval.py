"""Translates one split with a trained model and scores it with sacrebleu, or translates your text.

  python eval.py --workdir=runs/m30k --split=test_2016 --checkpoint=avg:5 --beam_size=5
  echo "Ein Mann fährt Fahrrad." | python eval.py --workdir=runs/m30k --input=-
  python eval.py --workdir=runs/m30k --input=de.txt --output=en.txt --beam_size=5 --nbest=3

With --input (a file, or '-' for stdin) it writes one detokenised translation per input line, in
input order, to --output (default stdout); an empty line gives an empty line. With --nbest=N each
input line gives N lines `LINE<TAB>SCORE<TAB>TRANSLATION` (LINE counts from 1, SCORE is the
length-penalised log-probability), best first; an empty line gives N empty translations of score 0.
To keep the model loaded and translate lines as they arrive: scripts/translate.py.

Everything comes from the workdir: config.json (saved by train.py) rebuilds data, vocabularies and
model, checkpoints/ holds the parameters. --checkpoint: 'last', 'best' (lowest validation loss), a
saved step, or 'avg:N' (the mean of the N most recent checkpoints). Beam size and length penalty
default to config.eval, the batch size to config.data.eval_batch_size.

Writes WORKDIR/eval/<split>.hyp.txt (detokenised, one line per source line, in source order) and
WORKDIR/eval/<split>.json (--out_dir picks another folder) with the sacrebleu scores: `bleu`
(detokenised, cased, with signature), `chrf`, `tokenized_bleu` (what papers report: hypotheses
normalised, Moses-tokenised and lowercased as the references were, scored with tokenize='none'
against the dataset's tokenized references) and `buckets` (count and BLEU per source length in
words, for length extrapolation).
"""

import contextlib
import json
import os
import sys
import time

from absl import app, flags
from etils import epath
import jax
import ml_collections

from data import datasets, pipeline
from training import command_line, partitioning, run_dir, run_log
from evaluation import trained_model, translating
from evaluation.line_translator import LineTranslator, write_translations


def decoding_settings(config: ml_collections.ConfigDict, flag_settings: dict,
                      batch_size: int | None) -> tuple[dict, int]:
  """`translate` keyword arguments and batch size: the flags, or the config where a flag is None.

  An unset --smallest_batch keeps one search loop of the whole batch. Its halvings (one compiled
  loop each) cost more compiling than they save in decoding on a test set of Multi30k's size:
  the whole process for test_2016 took 21.4 s with them and 19.1 s without on the 2-core Xeon VM
  (compiled programs cached), and an H200 compiled them for 60 s against 24 s (docs/performance.md).
  """
  settings = dict(flag_settings)
  for name in ('beam_size', 'length_penalty'):
    if settings[name] is None:
      settings[name] = config.eval[name]
  batch_size = batch_size or config.data.eval_batch_size
  translating.check_batch_size(batch_size, '--batch_size')
  if settings['smallest_batch'] is None:
    settings['smallest_batch'] = batch_size
  return settings, batch_size


# Fewest sentences of a batch per CPU device that eval.py's default split keeps: on the 2-core
# Zen 5 VM, beam 5 on test_2016 decoded fastest at 16 per device (batch 32 over 2 devices), ahead
# of 32 and 8.
_MIN_SENTENCES_PER_CPU_DEVICE = 16


def use_cpu_devices(requested: int, batch_size: int) -> None:
  """Splits the CPU into devices before JAX starts its backend, as `--cpu_devices` asks.

  Each device searches its own rows of a batch (`partitioning.per_device_rows`), so two devices
  keep both cores of a 2-core CPU busy through the many small operations of a search step,
  where one device uses ~1.5. 0 picks one per core, as many as divide `batch_size` with at least
  16 sentences each. XLA_FLAGS' --xla_force_host_platform_device_count, when set, wins. Only
  the CPU backend is split: on GPU or TPU the devices are the accelerators.
  """
  if 'xla_force_host_platform_device_count' in os.environ.get('XLA_FLAGS', ''):
    return
  if not requested:
    cores = len(os.sched_getaffinity(0))
    requested = max(count for count in range(1, cores + 1) if count == 1 or (
        batch_size % count == 0 and batch_size // count >= _MIN_SENTENCES_PER_CPU_DEVICE))
  jax.config.update('jax_num_cpu_devices', requested)


def translate_split(run: trained_model.Restored, split: str, settings: dict, batch_size: int,
                    mesh) -> tuple[list[str], dict]:
  """Detokenised hypotheses of `split` in source order, and the decoding times.

  Every batch shape is compiled before the decode loop, so its time and speed exclude compilation.
  """
  batches = pipeline.make_eval_batches(run.data, run.vocabularies, split, batch_size)
  translator = translating.SplitTranslator(run.model, run.vocabularies.target, batches, mesh,
                                           **settings)
  return translator(partitioning.replicate(run.variables, mesh))


def read_lines(path: str) -> list[str]:
  """The lines of `path` ('-': stdin) as text, or a ValueError naming the first that is not UTF-8."""
  with (open(path, 'rb') if path != '-' else os.fdopen(os.dup(sys.stdin.fileno()), 'rb')) as stream:
    raw_lines = stream.read().splitlines()
  lines = []
  for number, raw in enumerate(raw_lines, start=1):
    try:
      lines.append(raw.decode('utf-8'))
    except UnicodeDecodeError as error:
      raise ValueError(f'--input line {number} is not valid UTF-8 ({error.reason} at byte '
                       f'{error.start})') from None
  return lines


def print_table(report: dict) -> None:
  decoding = report['decoding']
  print(f'{report["split"]}: {report["sentences"]} sentences, checkpoint {report["checkpoint"]} '
        f'(steps {report["checkpoint_steps"]}), beam {decoding["beam_size"]}, length penalty '
        f'{decoding["length_penalty"]} ({decoding["length_penalty_form"]})')
  print(f'  BLEU {report["bleu"]:.2f} ({report["bleu_signature"]}), chrF {report["chrf"]:.2f}, '
        f'tokenized BLEU {report["tokenized_bleu"]:.2f}')
  print('  source words  sentences    BLEU')
  for bucket in report['buckets']:
    bleu = '-' if bucket['bleu'] is None else f'{bucket["bleu"]:.2f}'
    print(f'  {bucket["source_words"]:>12}  {bucket["count"]:>9}  {bleu:>6}')
  print(f'  decode {report["decode_s"]:.1f} s ({report["sentences_per_sec"]:.1f} sentences/s) after '
        f'{report["compile_s"]:.1f} s compiling; wall {report["wall_s"]:.1f} s on {report["devices"]}')


# The search's flags, `translate` keyword arguments once decoding_settings fills the unset ones.
SEARCH_FLAGS = ('beam_size', 'length_penalty', 'length_penalty_form', 'early_stopping',
                'max_length_a', 'max_length_b', 'smallest_batch')


def define_decoding_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The flags eval.py and scripts/translate.py share: the run, its checkpoint, the search and the
  hypotheses written per input line."""
  flags.DEFINE_string('workdir', None, 'Run directory of train.py.', required=True,
                      flag_values=flag_values)
  flags.DEFINE_string('checkpoint', 'last', "'last', 'best', a saved step, or 'avg:N'.",
                      flag_values=flag_values)
  flags.DEFINE_integer('nbest', 1, 'Hypotheses written per input line, with their scores '
                       '(at most the beam size).', lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('beam_size', None, 'Beam width, 1 for greedy search '
                       '(default: config.eval.beam_size).', lower_bound=1, flag_values=flag_values)
  flags.DEFINE_float('length_penalty', None, 'Length penalty alpha '
                     '(default: config.eval.length_penalty).', flag_values=flag_values)
  flags.DEFINE_enum('length_penalty_form', 'fairseq', ['fairseq', 'gnmt'],
                    'score / len**alpha, or GNMT score / ((5 + len) / 6)**alpha.',
                    flag_values=flag_values)
  flags.DEFINE_bool('early_stopping', False, "Stop a sentence's beam search at its K-th finished "
                    'hypothesis, as fairseq does, instead of when no alive one can beat it '
                    '(exact; for alpha > 0 often the length limit).', flag_values=flag_values)
  flags.DEFINE_integer('max_length_a', 10, 'Tokens generated at most: a + b * source length; '
                       'this is a.', lower_bound=0, flag_values=flag_values)
  flags.DEFINE_float('max_length_b', 1.2, 'b of the length limit a + b * source length.',
                     lower_bound=0.0, flag_values=flag_values)


def search_flag_settings(args: flags.FlagValues) -> dict:
  """The search flags' values; None for one the program does not define (its default)."""
  return {name: args[name].value if name in args else None for name in SEARCH_FLAGS}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """eval.py's command line; only when run as a program, so scripts can import this module (or
  into a FlagValues of their own, to call `evaluate` in-process).

  No --config flag: the config is the one the run saved in WORKDIR/config.json.
  """
  define_decoding_flags(flag_values)
  flags.DEFINE_string('split', None, 'Split to translate and score, e.g. test_2016.',
                      flag_values=flag_values)
  flags.DEFINE_string('input', None, "Text file to translate, one sentence per line; '-' for stdin.",
                      flag_values=flag_values)
  flags.DEFINE_string('output', None, 'Where --input translations go (default: stdout).',
                      flag_values=flag_values)
  flags.mark_flags_as_mutual_exclusive(['split', 'input'], required=True, flag_values=flag_values)
  flags.DEFINE_integer('batch_size', None, 'Sentences per batch '
                       '(default: config.data.eval_batch_size).', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('smallest_batch', None, 'Beam search drops finished sentences from a '
                       'batch in halvings down to this many (one compiled search loop per '
                       'halving): ~10-15% faster decoding on a CPU for longer compiling, which '
                       'may pay on much larger splits (default: --batch_size, a single loop).',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('cpu_devices', 0, 'Devices the CPU is split into, each searching its own '
                       'rows of a batch (0: one per core while each gets at least 16 sentences).',
                       lower_bound=0, flag_values=flag_values)
  flags.DEFINE_string('out_dir', None, 'Folder of the hypotheses and JSON report '
                      '(default: WORKDIR/eval); one per setting when comparing several.',
                      flag_values=flag_values)


def main(argv):
  del argv
  start = time.perf_counter()
  # The table (or the translations) is the output; library INFO records (orbax) would bury it.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  evaluate_or_exit(flags.FLAGS, start)


def evaluate_or_exit(args, start: float) -> None:
  """`evaluate`, with a bad input or a failed read or write as a one-line SystemExit."""
  try:
    evaluate(args, start)
  except ValueError as error:
    raise SystemExit(f'eval.py: {command_line.one_line_error(error)}') from None
  except OSError as error:  # an unreadable --input, an unwritable output or run folder
    raise SystemExit(f'eval.py: {run_dir.os_error_line(error)}') from None


def evaluate(args, start: float) -> None:
  """Translates --input or scores --split; every destination is opened before the model loads."""
  workdir, split, checkpoint = args.workdir, args.split, args.checkpoint
  flag_settings = search_flag_settings(args)
  lines = read_lines(args.input) if args.input else None
  config = trained_model.load_config(workdir)
  out_dir = epath.Path(args.out_dir) if args.out_dir else run_dir.path(workdir, run_dir.EVAL_DIR)
  if lines is None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if run_dir.is_local(out_dir) and not os.access(out_dir, os.W_OK):
      raise ValueError(f'{out_dir} is not writable: choose another folder with --out_dir')
  with (open(args.output, 'w', encoding='utf-8') if args.output else contextlib.nullcontext(
      sys.stdout)) as output:
    use_cpu_devices(args.cpu_devices, args.batch_size or config.data.eval_batch_size)
    mesh = partitioning.make_mesh()
    # As in train.py: the search compiled per batch shape (and per halving of the batch) is
    # reused by every later eval of a model of this shape.
    jax.config.update('jax_compilation_cache_dir', str(datasets.compilation_cache_dir(config.data)))
    run = trained_model.restore(workdir, split, checkpoint, mesh)
    settings, batch_size = decoding_settings(run.config, flag_settings, args.batch_size)
    if lines is not None:
      translator = LineTranslator(run, settings, batch_size, args.nbest, mesh)
      write_translations(translator(lines), args.nbest, output)
      return
  hypotheses, timing = translate_split(run, split, settings, batch_size, mesh)
  report = {
      'workdir': workdir if not run_dir.is_local(workdir) else os.path.abspath(workdir),
      'split': split, 'sentences': len(hypotheses),
      'checkpoint': checkpoint, 'checkpoint_steps': run.steps,
      'decoding': dict(settings, batch_size=batch_size),
      **translating.score(hypotheses, datasets.load_split_text(run.data, split), run.data),
      **timing, 'devices': f'{jax.device_count()} x {jax.devices()[0].device_kind}',
  }
  report['wall_s'] = time.perf_counter() - start
  (out_dir / f'{split}.hyp.txt').write_text(''.join(line + '\n' for line in hypotheses), encoding='utf-8')
  (out_dir / f'{split}.json').write_text(json.dumps(report, indent=2))
  print_table(report)


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)
