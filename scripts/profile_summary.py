"""The top operations of a jax.profiler trace: time per operation name and its share.

  python -m scripts.profile_summary /tmp/profile --top=15

Reads the Perfetto trace that `jax.profiler.trace(DIR, create_perfetto_trace=True)` writes
(DIR/plugins/profile/*/perfetto_trace.json.gz, Chrome's trace-event JSON) and sums the durations
of its complete events by name. On an accelerator it counts the device's "XLA Ops" lines (one
event per HLO operation; the stream lines hold the same time again as kernels), else all of its
lines. A CPU trace has no device: there it counts each host event's own time (less the events
nested inside it on its thread, such as the thunks of a jitted call), leaves out the Python frames
the profiler records ('$file.py:line') and the time threads spend waiting on each other, and sums
the numbered copies of an operation ('ynn_fusion.406') under one name, so that the shares say
which kinds of work the cores do. On an accelerator it also gives the share of the trace's span in
which the device ran anything: the rest it waited on the host.
"""

import collections
import gzip
import json
from pathlib import Path
import re

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


# A CPU thread's time spent waiting for other threads' work, which the profiler records as events.
_WAITS = ('(wait for completion)', 'Await')


def _device_operations(events: list[dict]) -> list[dict] | None:
  """The device's operation events (its "XLA Ops" lines, else all its lines), or None for a trace
  without a device."""
  names = {(event['pid'], event.get('tid')): event['args']['name'] for event in events
           if event.get('ph') == 'M' and event.get('name') in ('process_name', 'thread_name')}
  device = {pid for (pid, tid), name in names.items() if tid is None and name.startswith('/device:')}
  if not device:
    return None
  on_device = [event for event in events if event.get('ph') == 'X' and event['pid'] in device]
  ops = [event for event in on_device if 'XLA Ops' in names.get((event['pid'], event.get('tid')), '')]
  return ops or on_device


def operation_seconds(events: list[dict]) -> collections.Counter:
  """Seconds per operation name, each operation's time counted once (see the module docstring)."""
  seconds = collections.Counter()
  device_operations = _device_operations(events)
  if device_operations is not None:
    for event in device_operations:
      seconds[event['name']] += event.get('dur', 0.0) / 1e6  # trace time is in microseconds
    return seconds
  complete = [event for event in events if event.get('ph') == 'X']
  threads = collections.defaultdict(list)
  for event in complete:
    if not event['name'].startswith('$'):
      threads[event['pid'], event.get('tid')].append(event)
  for thread in threads.values():
    enclosing = []  # [(name, end)] of the events open at this point, innermost last
    for event in sorted(thread, key=lambda event: (event['ts'], -event.get('dur', 0.0))):
      while enclosing and enclosing[-1][1] <= event['ts']:
        enclosing.pop()
      name, duration = re.sub(r'\.\d+$', '', event['name']), event.get('dur', 0.0) / 1e6
      seconds[name] += duration
      if enclosing:
        seconds[enclosing[-1][0]] -= duration
      enclosing.append((name, event['ts'] + event.get('dur', 0.0)))
  for name in [name for name in seconds if any(wait in name for wait in _WAITS)]:
    del seconds[name]
  return seconds


def device_busy(events: list[dict]) -> float | None:
  """The share of the trace's span (its first event's start to its last one's end) in which the
  device ran an operation, overlapping operations counted once; None without a device.

  A trace that starts and stops with the device idle, as train.py's (train.profile_steps), spans
  its steps and the host's work between them: 1 - busy is the share the device waited on the host.
  """
  device_operations = _device_operations(events)
  if device_operations is None:
    return None
  complete = [event for event in events if event.get('ph') == 'X']
  span = (max(event['ts'] + event.get('dur', 0.0) for event in complete)
          - min(event['ts'] for event in complete))
  busy, covered_to = 0.0, float('-inf')
  for start, end in sorted((event['ts'], event['ts'] + event.get('dur', 0.0))
                           for event in device_operations):
    if end > covered_to:
      busy += end - max(start, covered_to)
      covered_to = end
  return busy / span if span else None


def top_operations(events: list[dict], count: int) -> list[tuple[str, float, float]]:
  """[(name, seconds, share of the counted time)], the longest `count` first."""
  seconds = operation_seconds(events)
  total = sum(seconds.values()) or 1.0
  return [(name, value, value / total) for name, value in seconds.most_common(count)]


def format_table(rows: list[tuple[str, float, float]]) -> str:
  return '\n'.join(f'{share:6.1%}  {value * 1e3:10.2f} ms  {name}' for name, value, share in rows)


def main(argv):
  if len(argv) != 2:
    raise SystemExit('usage: python -m scripts.profile_summary TRACE_DIR [--top=N]')
  events = read_events(argv[1])
  print(format_table(top_operations(events, TOP.value)))
  busy = device_busy(events)
  if busy is not None:
    print(f'device busy {busy:.1%} of the trace\'s span')


if __name__ == '__main__':
  app.run(main)
