"""Translates one split with a trained model and scores it with sacrebleu, or translates your text.

  python eval.py --workdir=runs/m30k --split=test_2016 --checkpoint=avg:5 --beam_size=5
  echo "Ein Mann fährt Fahrrad." | python eval.py --workdir=runs/m30k --input=-
  python eval.py --workdir=runs/m30k --input=de.txt --output=en.txt --beam_size=5 --nbest=3

With --input (a file, or '-' for stdin) it writes one detokenised translation per input line, in
input order, to --output (default stdout); an empty line gives an empty line. With --nbest=N each
input line gives N lines `LINE<TAB>SCORE<TAB>TRANSLATION` (LINE counts from 1, SCORE is the
length-penalised log-probability), best first.

Everything comes from the workdir: config.json (saved by train.py) rebuilds data, tokenizer and
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

import json
import os
import sys
import time
from typing import NamedTuple

from absl import app, flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import sacrebleu
import sacremoses

import train
from data import batching, datasets, pipeline, token_ids, tokenizer as tokenizer_lib
from model import decoding
from model.translate import beam_translate, translate
from model.transformer import Transformer
from training import averaging, partitioning, run_dir, run_log, validation
from training.checkpointing import Checkpointer, DamagedCheckpointError, first_mismatch

# Upper ends of the source-length buckets in words; longer sources form the last bucket.
BUCKET_ENDS = (10, 20, 30, 40)
# Whether the dataset's tokenized references went through Moses' normalize-punctuation.perl:
# Multi30k's lc.norm.tok files did, fairseq's prepare-iwslt14.sh does not normalise.
_REFERENCES_NORMALISED = {'multi30k': True, 'iwslt14': False}
_CHECKPOINT_FORMS = "'last', 'best', a saved step such as 3000, or 'avg:N' with N >= 1"


class Restored(NamedTuple):
  """What `restore` rebuilds from a workdir; `steps` are the checkpoints behind `variables`."""
  config: ml_collections.ConfigDict
  tokenizer: tokenizer_lib.Tokenizer
  model: Transformer
  variables: dict
  steps: list[int]


def parse_checkpoint(spec: str) -> tuple[str, int | None]:
  """'last' -> ('last', None), 'best' -> ('best', None), '3000' -> ('step', 3000), 'avg:5' -> ('avg', 5)."""
  if spec in ('last', 'best'):
    return spec, None
  kind, number = ('avg', spec[len('avg:'):]) if spec.startswith('avg:') else ('step', spec)
  # isdigit() also turns away '', '-1' and '1.5'.
  if not number.isdigit() or (kind == 'avg' and int(number) < 1):
    raise ValueError(f'--checkpoint={spec!r} is not {_CHECKPOINT_FORMS}')
  return kind, int(number)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config train.py saved as WORKDIR/config.json, checked."""
  path = run_dir.path(workdir, run_dir.CONFIG_FILE)
  if not os.path.isfile(path):
    raise ValueError(f'no {run_dir.CONFIG_FILE} in {workdir}: not a run directory of train.py')
  try:
    with open(path) as f:
      config = ml_collections.ConfigDict(json.load(f))
    validation.check_config(config)
  except ValueError as error:  # json.JSONDecodeError included
    raise ValueError(f'{path}: {error}') from None
  return config


def checkpoint_steps(checkpointer: Checkpointer, kind: str, number: int | None) -> list[int]:
  """The saved steps that --checkpoint names (several for 'avg:N')."""
  saved = checkpointer.all_steps()
  listing = f'{checkpointer.directory} holds steps {", ".join(map(str, saved))}'
  if kind == 'avg':
    return averaging.latest_steps(checkpointer, number)
  if kind == 'best':
    best = checkpointer.best_step()
    if best is None:
      raise ValueError(f'--checkpoint=best: no checkpoint has a validation loss; {listing}')
    return [best]
  step = checkpointer.latest_step() if kind == 'last' else number
  if step not in saved:
    raise ValueError(f'--checkpoint={step}: no such checkpoint; {listing}')
  return [step]


def restore_target(checkpointer: Checkpointer, step: int, model: Transformer, mesh) -> dict:
  """Abstract arrays of the train state saved at `step`, replicated on `mesh`, from its metadata.

  As a restore target it fits whatever optimizer the run used, and it lets a shape mismatch be
  found before restoring: a restore that fails part-way leaves orbax's pending reads printing
  pages of TensorStore specs.

  Raises:
    DamagedCheckpointError: the checkpoint's metadata cannot be read.
    ValueError: the checkpoint does not fit `model`.
  """
  sharding = partitioning.replicated(mesh)
  target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                        checkpointer.saved_structure(step))
  dummy = jnp.ones((1, 8), jnp.int32)
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), dummy, dummy, train=False))
  mismatch = first_mismatch(expected, train.model_variables(target['params'], target['batch_stats']))
  if mismatch:
    raise ValueError(f'checkpoint at {checkpointer.directory / str(step)} does not match the model of '
                     f'{run_dir.path(os.path.dirname(checkpointer.directory), run_dir.CONFIG_FILE)}: '
                     f'{mismatch}')
  return target


def restore(workdir: str, split: str | None, checkpoint: str, mesh) -> Restored:
  """Rebuilds tokenizer and model from WORKDIR/config.json and restores (or averages) variables.

  Every check of the command line and of the workdir runs before the tokenizer is loaded. With
  --checkpoint=last a checkpoint that cannot be read is reported on stderr in one line and the
  next older one is used; a damaged checkpoint named any other way is refused.

  Raises:
    ValueError: with a one-line message, for any bad input.
  """
  kind, number = parse_checkpoint(checkpoint)
  config = load_config(workdir)
  if split is not None:
    datasets.check_split(config.data.dataset, split)
  # Read-only: the run may still be training, and a save of it in progress must stay.
  checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints,
                              save_every=config.train.checkpoint_every, read_only=True)
  select = lambda state: train.model_variables(state['params'], state['batch_stats'])
  try:
    if not checkpointer.all_steps():
      raise ValueError(f'no checkpoint in {checkpointer.directory}: train.py has not saved one yet')
    steps = checkpoint_steps(checkpointer, kind, number)
    tokenizer_path = run_dir.path(workdir, run_dir.TOKENIZER_FILE)
    if not os.path.exists(tokenizer_path):
      raise ValueError(f'no {run_dir.TOKENIZER_FILE} in {workdir}: not a workdir written by train.py')
    tokenizer = tokenizer_lib.Tokenizer(tokenizer_path)
    model = train.build_model(config, tokenizer.vocab_size)
    # With 'last', older checkpoints stand in for a damaged newest one.
    candidates = sorted(checkpointer.all_steps(), reverse=True) if kind == 'last' else [steps]
    for candidate in candidates:
      candidate_steps = candidate if isinstance(candidate, list) else [candidate]
      try:
        # Checkpoints of one run share a structure: the newest one stands for all of them.
        target = restore_target(checkpointer, candidate_steps[-1], model, mesh)
        # The mean of one checkpoint is the checkpoint itself.
        variables = averaging.load_average(checkpointer, candidate_steps, target, select=select)
      except DamagedCheckpointError as error:
        if kind != 'last':
          others = [step for step in checkpointer.all_steps() if step != error.step]
          raise ValueError(f'{error}; other saved steps: {", ".join(map(str, others)) or "none"}') from None
        print(f'eval.py: {error}; trying the next older checkpoint', file=sys.stderr, flush=True)
        continue
      return Restored(config, tokenizer, model, variables, candidate_steps)
    raise ValueError(f'no checkpoint in {checkpointer.directory} can be restored')
  finally:
    checkpointer.close()


def tokenize_like_references(lines: list[str], data_config) -> list[str]:
  """Hypotheses in the form of SplitText.reference_tokenized, for tokenized BLEU."""
  if data_config.dataset_config == 'tokenized':
    # The model was trained on, and so writes, the tokenized text itself.
    return list(lines)
  normaliser = sacremoses.MosesPunctNormalizer(lang=data_config.target_lang)
  tokenizer = sacremoses.MosesTokenizer(lang=data_config.target_lang)
  normalise = _REFERENCES_NORMALISED[data_config.dataset]
  # escape=True as tokenizer.perl's default, which wrote both datasets' references ("&apos;s").
  return [tokenizer.tokenize(normaliser.normalize(line) if normalise else line, escape=True,
                             return_str=True).lower() for line in lines]


def length_buckets(sources: list[str], hypotheses: list[str], references: list[str]) -> list[dict]:
  """Count and detokenised BLEU (None when empty) of each source-length bucket, in words."""
  starts = (1,) + tuple(end + 1 for end in BUCKET_ENDS)
  names = [f'{start}-{end}' for start, end in zip(starts, BUCKET_ENDS)] + [f'{starts[-1]}+']
  bucket_of = np.searchsorted(BUCKET_ENDS, [len(source.split()) for source in sources])
  buckets = []
  for i, name in enumerate(names):
    members = np.flatnonzero(bucket_of == i)
    hyps, refs = [hypotheses[j] for j in members], [references[j] for j in members]
    bleu = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs]).score if hyps else None
    buckets.append({'source_words': name, 'count': len(hyps), 'bleu': bleu})
  return buckets


def score(hypotheses: list[str], text: datasets.SplitText, data_config) -> dict:
  """Every score of the JSON report, computed by sacrebleu."""
  bleu, chrf, tokenized_bleu = (sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF(),
                                sacrebleu.metrics.BLEU(tokenize='none'))
  return {
      'bleu': bleu.corpus_score(hypotheses, [text.reference]).score,
      'bleu_signature': str(bleu.get_signature()),
      'chrf': chrf.corpus_score(hypotheses, [text.reference]).score,
      'chrf_signature': str(chrf.get_signature()),
      'tokenized_bleu': tokenized_bleu.corpus_score(
          tokenize_like_references(hypotheses, data_config), [text.reference_tokenized]).score,
      'tokenized_bleu_signature': str(tokenized_bleu.get_signature()),
      'buckets': length_buckets(text.source, hypotheses, text.reference),
  }


def decoding_settings(config: ml_collections.ConfigDict, flag_settings: dict,
                      batch_size: int | None) -> tuple[dict, int]:
  """`translate` keyword arguments and batch size: the flags, or the config where a flag is None."""
  settings = dict(flag_settings)
  for name in ('beam_size', 'length_penalty'):
    if settings[name] is None:
      settings[name] = config.eval[name]
  batch_size = batch_size or config.data.eval_batch_size
  if batch_size % jax.device_count():
    raise ValueError(f'--batch_size={batch_size} must be a multiple of the {jax.device_count()} devices')
  return settings, batch_size


def translate_split(run: Restored, split: str, settings: dict, batch_size: int, mesh
                    ) -> tuple[list[str], dict]:
  """Detokenised hypotheses of `split` in source order, and the decoding times.

  Every batch shape is compiled before the decode loop, so its time and speed exclude compilation.
  """
  batches = pipeline.make_eval_batches(run.config.data, run.tokenizer, split, batch_size)
  variables = partitioning.replicate(run.variables, mesh)
  inputs = [jax.device_put(batch['encoder_input_tokens'], partitioning.batch_sharded(mesh))
            for batch in batches]
  start = time.perf_counter()
  executables = {}
  for tokens in inputs:
    if tokens.shape not in executables:
      executables[tokens.shape] = translate.lower(run.model, variables, tokens, **settings).compile()
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  # A compiled call takes the traced arguments only: the length penalty is one of them.
  outputs = [executables[tokens.shape](variables, tokens, length_penalty=settings['length_penalty'])
             for tokens in inputs]
  outputs = [np.asarray(output) for output in outputs]  # waits for the device
  decode_s = time.perf_counter() - start
  hypotheses = [''] * sum(int((batch['example_index'] >= 0).sum()) for batch in batches)
  for batch, tokens in zip(batches, outputs):
    for index, ids in zip(batch['example_index'], tokens):
      if index >= 0:
        # Byte-fallback pieces can decode to line breaks, which would misalign the hyp file.
        hypotheses[index] = ' '.join(run.tokenizer.decode(ids).splitlines())
  return hypotheses, {'compile_s': compile_s, 'decode_s': decode_s,
                      'sentences_per_sec': len(hypotheses) / decode_s}


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


def translate_lines(run: Restored, lines: list[str], settings: dict, batch_size: int, nbest: int,
                    mesh) -> list[list[tuple[float, str]]]:
  """The `nbest` best (score, translation) of every line, batched by length, in input order.

  Empty lines are not translated: they get no hypotheses. Raises ValueError, before decoding
  anything, for a line longer than the model's positions allow.
  """
  if nbest > settings['beam_size']:
    raise ValueError(f'--nbest={nbest} exceeds the beam size {settings["beam_size"]}: a beam '
                     f'search keeps that many hypotheses; raise --beam_size')
  ids = run.tokenizer.encode_batch(lines)
  max_position = run.config.model.max_position
  for number, line_ids in enumerate(ids, start=1):
    padded = batching.round_up(len(line_ids) + 1, 8)
    generated = decoding.decode_length_limit(padded, settings['max_length_a'], settings['max_length_b'])
    if max(padded, generated) > max_position:
      raise ValueError(f'--input line {number} has {len(line_ids)} subword tokens: with its EOS and '
                       f'up to {generated} generated tokens it exceeds the model\'s max_position '
                       f'{max_position}; split the line')
  translated = [row for row, line_ids in enumerate(ids) if line_ids]  # the non-empty lines
  source = token_ids.RaggedIds.from_lists([ids[row] for row in translated])
  variables = partitioning.replicate(run.variables, mesh)
  results = [[] for _ in lines]
  for batch in pipeline.make_source_batches(source, batch_size):
    tokens = jax.device_put(batch['encoder_input_tokens'], partitioning.batch_sharded(mesh))
    hypotheses, scores = beam_translate(run.model, variables, tokens, **settings)  # [B, K, T], [B, K]
    hypotheses, scores = np.asarray(hypotheses), np.asarray(scores)
    for i, index in enumerate(batch['example_index']):
      if index >= 0:
        results[translated[index]] = [
            (float(scores[i, k]), ' '.join(run.tokenizer.decode(hypotheses[i, k]).splitlines()))
            for k in range(nbest)]
  return results


def write_translations(results: list[list[tuple[float, str]]], nbest: int, stream) -> None:
  for number, hypotheses in enumerate(results, start=1):
    if nbest == 1:
      stream.write((hypotheses[0][1] if hypotheses else '') + '\n')
    else:
      for score, text in hypotheses:
        stream.write(f'{number}\t{score:.4f}\t{text}\n')


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


def define_flags() -> None:
  """eval.py's command line; only when run as a program, so scripts can import this module.

  No --config flag: the config is the one the run saved in WORKDIR/config.json.
  """
  flags.DEFINE_string('workdir', None, 'Run directory of train.py.', required=True)
  flags.DEFINE_string('split', None, 'Split to translate and score, e.g. test_2016.')
  flags.DEFINE_string('input', None, "Text file to translate, one sentence per line; '-' for stdin.")
  flags.DEFINE_string('output', None, 'Where --input translations go (default: stdout).')
  flags.DEFINE_integer('nbest', 1, 'Hypotheses written per --input line, with their scores '
                       '(at most the beam size).', lower_bound=1)
  flags.mark_flags_as_mutual_exclusive(['split', 'input'], required=True)
  flags.DEFINE_string('checkpoint', 'last', "'last', 'best', a saved step, or 'avg:N'.")
  flags.DEFINE_integer('beam_size', None, 'Beam width, 1 for greedy search '
                       '(default: config.eval.beam_size).', lower_bound=1)
  flags.DEFINE_float('length_penalty', None, 'Length penalty alpha '
                     '(default: config.eval.length_penalty).')
  flags.DEFINE_enum('length_penalty_form', 'fairseq', ['fairseq', 'gnmt'],
                    'score / len**alpha, or GNMT score / ((5 + len) / 6)**alpha.')
  flags.DEFINE_bool('early_stopping', False, "Stop a sentence's beam search at its K-th finished "
                    'hypothesis, as fairseq does, instead of when no alive one can beat it '
                    '(exact; for alpha > 0 often the length limit).')
  flags.DEFINE_integer('batch_size', None, 'Sentences per batch '
                       '(default: config.data.eval_batch_size).', lower_bound=1)
  flags.DEFINE_integer('max_length_a', 10, 'Tokens generated at most: a + b * source length; '
                       'this is a.', lower_bound=0)
  flags.DEFINE_float('max_length_b', 1.2, 'b of the length limit a + b * source length.',
                     lower_bound=0.0)
  flags.DEFINE_string('out_dir', None, 'Folder of the hypotheses and JSON report '
                      '(default: WORKDIR/eval); one per setting when comparing several.')


def main(argv):
  del argv
  start = time.perf_counter()
  # The table (or the translations) is the output; library INFO records (orbax) would bury it.
  run_log.route_library_logging(None, to_terminal=flags.FLAGS['verbosity'].present)
  args = flags.FLAGS
  workdir, split, checkpoint = args.workdir, args.split, args.checkpoint
  flag_settings = {name: args[name].value for name in (
      'beam_size', 'length_penalty', 'length_penalty_form', 'early_stopping', 'max_length_a',
      'max_length_b')}
  mesh = partitioning.make_mesh()
  try:
    lines = read_lines(args.input) if args.input else None
    run = restore(workdir, split, checkpoint, mesh)
    settings, batch_size = decoding_settings(run.config, flag_settings, args.batch_size)
    if lines is not None:
      results = translate_lines(run, lines, settings, batch_size, args.nbest, mesh)
  except ValueError as error:
    raise SystemExit(f'eval.py: {train.one_line_error(error)}') from None
  if lines is not None:
    if args.output:
      with open(args.output, 'w', encoding='utf-8') as f:
        write_translations(results, args.nbest, f)
    else:
      write_translations(results, args.nbest, sys.stdout)
    return
  hypotheses, timing = translate_split(run, split, settings, batch_size, mesh)
  report = {
      'workdir': os.path.abspath(workdir), 'split': split, 'sentences': len(hypotheses),
      'checkpoint': checkpoint, 'checkpoint_steps': run.steps,
      'decoding': dict(settings, batch_size=batch_size),
      **score(hypotheses, datasets.load_split_text(run.config.data, split), run.config.data),
      **timing, 'devices': f'{jax.device_count()} x {jax.devices()[0].device_kind}',
  }
  report['wall_s'] = time.perf_counter() - start
  out_dir = args.out_dir or os.path.join(workdir, 'eval')
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f'{split}.hyp.txt'), 'w') as f:
    f.write(''.join(line + '\n' for line in hypotheses))
  with open(os.path.join(out_dir, f'{split}.json'), 'w') as f:
    json.dump(report, f, indent=2)
  print_table(report)


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=train.parse_flags)
