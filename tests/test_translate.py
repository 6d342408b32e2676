"""scripts/translate.py: a model loaded once answers each stdin line before the next one is sent,
with eval.py --input's translations, and an empty or unusable line keeps its place."""

import queue
import subprocess
import sys
import threading

from tests.test_eval import REPO, run_eval, smoke_run  # pylint: disable=unused-import

LIMITS = ('--max_length_a=2', '--max_length_b=0.5')


def _line_reader(process: subprocess.Popen):
  """A function returning the process's next stdout line, failing if none comes within `timeout`
  seconds (a thread reads them as they come)."""
  lines = queue.Queue()
  threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()

  def next_line(timeout: float = 120.0) -> str:
    try:
      return lines.get(timeout=timeout).rstrip('\n')
    except queue.Empty:
      raise AssertionError(f'no answer within {timeout} s') from None

  return next_line


def test_each_line_is_answered_as_it_arrives_as_eval_py_translates_it(smoke_run, tmp_path):
  workdir, _ = smoke_run
  lines = ['Ein Mann fährt Fahrrad.', '', 'Zwei Hunde spielen im Schnee.', 'Ein Mann fährt Fahrrad.']
  process = subprocess.Popen(
      [sys.executable, '-m', 'scripts.translate', f'--workdir={workdir}', '--nbest=2', *LIMITS],
      cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  next_line, answers = _line_reader(process), []
  for line in lines:
    process.stdin.write(line + '\n')
    process.stdin.flush()  # the process must answer while its stdin stays open
    answers += [next_line(), next_line()]
  process.stdin.close()
  assert process.wait(timeout=60) == 0, process.stderr.read()[-2000:]
  assert answers[2:4] == ['2\t0.0000\t', '2\t0.0000\t']  # the empty line keeps its place
  assert answers[6:] == [answer.replace('1\t', '4\t', 1) for answer in answers[:2]]
  (tmp_path / 'in.txt').write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  # eval.py --input on one device, one sentence per batch: the same search, so the same numbers.
  result = run_eval(f'--workdir={workdir}', f'--input={tmp_path / "in.txt"}', '--nbest=2',
                    '--batch_size=1', '--cpu_devices=1', *LIMITS)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == answers


def test_a_bad_line_is_one_line_on_stderr_and_the_next_is_still_translated(smoke_run):
  workdir, _ = smoke_run
  result = subprocess.run(
      [sys.executable, '-m', 'scripts.translate', f'--workdir={workdir}', *LIMITS], cwd=REPO,
      input=b'Ein Hund \xff.\nEin Hund.\n', capture_output=True, timeout=300)
  assert result.returncode == 0
  outputs = result.stdout.decode().split('\n')
  assert len(outputs) == 3 and outputs[0] == '' and outputs[1]
  assert 'translate: line 1 is not valid UTF-8' in result.stderr.decode()
