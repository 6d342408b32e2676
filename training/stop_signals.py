"""Stopping a run cleanly on SIGTERM (SLURM, Kubernetes, preemptible VMs) or SIGINT (Ctrl-C).

The first signal only sets a flag: the training loop finishes its step, saves, marks the run
`stopped` and raises RunStopped. A second signal ends the process at once; the last complete
checkpoint is still there, as after a kill.

A multi-process run does not install these handlers: each host would see its signal at a
different step. JAX's preemption service (on under `jax.distributed`) turns SIGTERM into a step
all processes agree on (`multihost_utils.reached_preemption_sync_point`), which the loop asks
instead.
"""

import os
import signal
import sys
import threading

from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(Exception):
  """The run stopped on a signal after saving; exit with `exit_code` (128 + the signal's number)."""

  def __init__(self, signum: int, step: int, saved: bool):
    self.signum, self.step, self.exit_code = signum, step, 128 + signum
    name = signal.Signals(signum).name
    super().__init__(f'stopped by {name} at step {step}'
                     + (', checkpoint saved' if saved else '') + '; run the same command to resume')


class StopSignals:
  """Turns SIGTERM and SIGINT into a flag polled once per step, between install and uninstall.

  Outside the main thread (where Python cannot install handlers) and on multi-process runs it
  installs nothing and only the preemption service can stop the run.
  """

  def __init__(self, *, multiprocess: bool, say=None):
    """Args: multiprocess: install nothing (see above); say: prints a notice on its own line (the
    console's, which keeps it off the progress bar's line); stderr by default."""
    self._multiprocess = multiprocess
    self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    self._previous = {}
    self.received: int | None = None

  def _handle(self, signum, frame) -> None:
    del frame
    if self.received is not None:
      self._say(f'second {signal.Signals(signum).name}: exiting now, without saving')
      os._exit(128 + signum)  # pylint: disable=protected-access
    self.received = signum
    self._say(f'{signal.Signals(signum).name} received: stopping after this step (again to exit now)')

  def install(self) -> None:
    if not self._multiprocess and threading.current_thread() is threading.main_thread():
      for signum in SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)

  def uninstall(self) -> None:
    """Puts the previous handlers back."""
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def requested(self, step: int) -> int | None:
    """The signal to stop on after `step`, or None. Call at every step (all processes)."""
    if self._multiprocess:
      return signal.SIGTERM if multihost_utils.reached_preemption_sync_point(step) else None
    return self.received
