"""The top operations of a jax.profiler trace: time per operation name and its share.

  python -m scripts.profile_summary /tmp/profile --top=15

Reads the Perfetto trace that `jax.profiler.trace(DIR, create_perfetto_trace=True)` writes
(DIR/plugins/profile/*/perfetto_trace.json.gz, Chrome's trace-event JSON) and sums the durations
of its complete events by name. On an accelerator it counts the device's "XLA Ops" lines (one
event per HLO operation; the stream lines hold the same time again as kernels), else all of its
lines; a CPU trace has no device, so it counts the host's events less the Python frames the
profiler records ('$file.py:line'). Shares are of the time counted, so nested host events
(a jitted call and the thunks inside it) add up to more than the wall time.
"""

import collections
import gzip
import json
from pathlib import Path

from absl import app, flags

TOP = flags.DEFINE_integer('top', 15, 'Operations listed.')


def read_events(trace_dir: str) -> list[dict]:
  """The events of the newest Perfetto trace under `trace_dir`."""
  traces = sorted(Path(trace_dir).glob('**/perfetto_trace.json.gz'), key=lambda path: path.stat().st_mtime)
  if not traces:
    raise FileNotFoundError(f'{trace_dir} holds no perfetto_trace.json.gz (jax.profiler.trace with '
                            'create_perfetto_trace=True writes one)')
  with gzip.open(traces[-1]) as file:
    trace = json.load(file)
  return trace['traceEvents'] if isinstance(trace, dict) else trace


def counted_events(events: list[dict]) -> list[dict]:
  """The complete events that hold the operations' time, once (see the module docstring)."""
  names = {(event['pid'], event.get('tid')): event['args']['name'] for event in events
           if event.get('ph') == 'M' and event.get('name') in ('process_name', 'thread_name')}
  complete = [event for event in events if event.get('ph') == 'X']
  device = {pid for (pid, tid), name in names.items() if tid is None and name.startswith('/device:')}
  if device:
    on_device = [event for event in complete if event['pid'] in device]
    ops = [event for event in on_device if 'XLA Ops' in names.get((event['pid'], event.get('tid')), '')]
    return ops or on_device
  return [event for event in complete if not event['name'].startswith('$')]


def top_operations(events: list[dict], count: int) -> list[tuple[str, float, float]]:
  """[(name, seconds, share of the counted time)], the longest `count` first."""
  seconds = collections.Counter()
  for event in counted_events(events):
    seconds[event['name']] += event.get('dur', 0.0) / 1e6  # trace time is in microseconds
  total = sum(seconds.values()) or 1.0
  return [(name, value, value / total) for name, value in seconds.most_common(count)]


def format_table(rows: list[tuple[str, float, float]]) -> str:
  return '\n'.join(f'{share:6.1%}  {value * 1e3:10.2f} ms  {name}' for name, value, share in rows)


def main(argv):
  if len(argv) != 2:
    raise SystemExit('usage: python -m scripts.profile_summary TRACE_DIR [--top=N]')
  print(format_table(top_operations(read_events(argv[1]), TOP.value)))


if __name__ == '__main__':
  app.run(main)
