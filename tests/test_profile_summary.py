"""scripts/profile_summary.py on hand-made traces: which events count, and their shares."""

import gzip
import json

import pytest

from scripts import profile_summary


def metadata(kind, pid, name, tid=None):
  event = {'ph': 'M', 'name': kind, 'pid': pid, 'args': {'name': name}}
  if tid is not None:
    event['tid'] = tid
  return event


def op(name, pid, tid, microseconds, start=0):
  return {'ph': 'X', 'name': name, 'pid': pid, 'tid': tid, 'ts': start, 'dur': microseconds}


def test_a_device_trace_counts_its_xla_ops_line_once_and_leaves_the_host_out():
  events = [metadata('process_name', 1, '/host:CPU'), metadata('process_name', 2, '/device:GPU:0'),
            metadata('thread_name', 2, 'XLA Ops', tid=7), metadata('thread_name', 2, 'Stream #13', tid=8),
            op('fusion.1', 2, 7, 3000), op('dot.2', 2, 7, 1000), op('fusion.1', 2, 7, 1000),
            op('sm90_gemm_kernel', 2, 8, 4000),  # the same time again, as a kernel
            op('PjitFunction(step)', 1, 1, 9000)]
  rows = profile_summary.top_operations(events, 5)
  assert [(name, round(seconds, 6)) for name, seconds, _ in rows] == [('fusion.1', 0.004),
                                                                       ('dot.2', 0.001)]
  assert [share for _, _, share in rows] == pytest.approx([0.8, 0.2])


def test_device_busy_is_the_union_of_the_device_operations_over_the_traces_span():
  """A host call spans 0-10,000 µs; the device runs ops at 1,000-4,000 and 3,000-5,000 (overlapping:
  4,000 µs together) and 8,000-9,000, with the same time again as kernels on a stream: busy 50%."""
  events = [metadata('process_name', 1, '/host:CPU'), metadata('process_name', 2, '/device:GPU:0'),
            metadata('thread_name', 2, 'XLA Ops', tid=7), metadata('thread_name', 2, 'Stream #13', tid=8),
            op('PjitFunction(step)', 1, 1, 10000),
            op('fusion.1', 2, 7, 3000, start=1000), op('dot.2', 2, 7, 2000, start=3000),
            op('fusion.1', 2, 7, 1000, start=8000), op('sm90_gemm_kernel', 2, 8, 3000, start=1000)]
  assert profile_summary.device_busy(events) == pytest.approx(0.5)
  host_only = [metadata('process_name', 1, '/host:CPU'), op('PjitFunction(step)', 1, 1, 10000)]
  assert profile_summary.device_busy(host_only) is None


def test_a_cpu_trace_counts_each_events_own_time_by_kind_without_waits_or_python_frames(tmp_path):
  """Thread 1 runs a jitted call of 1,100 µs holding two thunks (600 and 100 µs) and waits 300 µs
  for thread 2, whose copy takes 200 µs: the call's own time is 100 µs, the two numbered copies
  of the fusion count as one, and neither the wait nor the Python frame counts."""
  events = [metadata('process_name', 1, '/host:CPU'),
            op('$profiler.py:307 trace', 1, 1, 5000),
            op('PjitFunction(step)', 1, 1, 1100, start=10),
            op('ynn_fusion.406', 1, 1, 600, start=20), op('ynn_fusion.7', 1, 1, 100, start=620),
            op('ThunkExecutor::Execute (wait for completion)', 1, 1, 300, start=720),
            op('copy_fusion.3', 1, 2, 200, start=720)]
  folder = tmp_path / 'plugins' / 'profile' / 'run'
  folder.mkdir(parents=True)
  with gzip.open(folder / 'perfetto_trace.json.gz', 'wt') as file:
    json.dump({'traceEvents': events}, file)
  rows = profile_summary.top_operations(profile_summary.read_events(str(tmp_path)), 5)
  assert [(name, round(seconds * 1e6)) for name, seconds, _ in rows] == [
      ('ynn_fusion', 700), ('copy_fusion', 200), ('PjitFunction(step)', 100)]
  assert [share for _, _, share in rows] == pytest.approx([0.7, 0.2, 0.1])
  with pytest.raises(FileNotFoundError, match='holds no perfetto_trace.json.gz'):
    profile_summary.read_events(str(tmp_path / 'plugins' / 'profile' / 'none'))
