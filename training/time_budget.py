"""A run's length fitted to wall-clock minutes (config.train.time_budget_minutes).

How many steps fit an hour depends on the machine (the Multi30k presets' 9600 steps take 51 min on
one 2-core VM and ~1 h 45 min on another), and a schedule that decays to 0 on the last step
('cosine', 'linear') must know that step before it starts decaying. Warmup does not depend on the
run's length, so a budgeted run measures itself while it warms up and fixes its length when warmup
ends: it times the steps of the second half of warmup, then one validation (less the compiling
that later validations reuse, training/compile_clock.py) and one checkpoint, and plans the most
steps whose training, validations and checkpoints end within the budget, less a reserve. The
length is an argument of the compiled step (training/trainer.py), so the planned schedule needs no
new compilation. num_steps / num_epochs stay the upper bound.

Step time drifts on a shared machine (epochs of one Xeon VM run took 91-141 s), so the run plans
again at every later validation, from the steps timed since, and between plans checks the clock at
every log step: it ends early, with its validation and checkpoint, where the next log step would
come too late (`must_stop`). training/budget_plan.py keeps the plans through the run.
"""

import dataclasses
import math

# What no clock of the loop sees, which the early end (`must_stop`) keeps back: the process's start-up
# before train_and_evaluate (imports, devices) and its exit after the last save.
UNTIMED_SECONDS = 30.0
# Kept back by the plan on top of UNTIMED_SECONDS, for what it does not time: batch shapes first met
# after the plan (compiled then) and small drift in step time. Without it any drift ended a run
# early: an 8-minute Xeon VM run 1.8% behind its steps was cut at step 550 of 585, its learning rate
# at 9% of the peak. Larger drift (6% and 12% on the Xeon VM, docs/results.md 7) is the early end's
# to catch; a reserve that large would cost every steadier machine minutes of training.
RESERVE_FRACTION = 0.03
# Fewest warmup steps to time: half of them are measured, after the first one's compilation.
MIN_WARMUP_STEPS = 20


@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured seconds of the work left in a run."""
  step_seconds: float  # one training step, data included, compilation excluded
  eval_seconds: float  # one validation (loss and greedy BLEU), compilation excluded
  save_seconds: float  # one checkpoint, the part the loop waits for


def check(budget_minutes, warmup_steps: int) -> None:
  """Raises ValueError (one line) for a budget that is not a number >= 0 or a warmup too short to time."""
  if isinstance(budget_minutes, bool) or not isinstance(budget_minutes, (int, float)) or not (
      budget_minutes >= 0 and math.isfinite(budget_minutes)):
    raise ValueError(f'config.train.time_budget_minutes={budget_minutes!r} must be a number of '
                     'minutes >= 0 (0: no budget)')
  if budget_minutes and warmup_steps < MIN_WARMUP_STEPS:
    raise ValueError(f'config.train.time_budget_minutes={budget_minutes} needs config.optim.'
                     f'warmup_steps >= {MIN_WARMUP_STEPS} (it is {warmup_steps}): the run\'s length '
                     'is fitted to the budget from the steps timed during warmup')


def _count_multiples(every: int, after: int, upto: int) -> int:
  """How many multiples of `every` lie in (after, upto]."""
  return upto // every - after // every


def seconds_left(costs: Costs, *, step: int, last_step: int, eval_every: int,
                 checkpoint_every: int) -> float:
  """Seconds from the end of `step` to the end of a run whose last step is `last_step`.

  Every step costs the same; a validation and a checkpoint follow each multiple of eval_every
  and checkpoint_every, and the last step (train.py's loop).
  """
  def pauses(every):
    return _count_multiples(every, step, last_step) + (1 if last_step % every else 0)

  return ((last_step - step) * costs.step_seconds + pauses(eval_every) * costs.eval_seconds
          + pauses(checkpoint_every) * costs.save_seconds)


def reserve_seconds(budget_seconds: float) -> float:
  """What the plan keeps back: what the early end keeps back, and room to drift within the budget."""
  return UNTIMED_SECONDS + RESERVE_FRACTION * budget_seconds


def plan_length(costs: Costs, *, budget_seconds: float, elapsed_seconds: float, step: int,
                max_steps: int, eval_every: int, checkpoint_every: int) -> int:
  """The most steps, at most `max_steps`, whose run ends within the budget less its reserve.

  At least step + 1: a schedule that decays to 0 needs a step after warmup, so a budget already
  spent still gets one (the console's plan line then shows an end past the budget).
  """
  if max_steps <= step:
    raise ValueError(f'max_steps={max_steps} leaves nothing to plan after step {step}')
  available = budget_seconds - reserve_seconds(budget_seconds) - elapsed_seconds
  fits = lambda last_step: seconds_left(costs, step=step, last_step=last_step, eval_every=eval_every,
                                        checkpoint_every=checkpoint_every) <= available
  low, high = step + 1, max_steps  # seconds_left grows with last_step: bisect for the last fit
  if not fits(low):
    return low
  while low < high:
    middle = (low + high + 1) // 2
    low, high = (middle, high) if fits(middle) else (low, middle - 1)
  return low


def must_stop(costs: Costs, *, budget_seconds: float, elapsed_seconds: float,
              steps_to_next_check: int) -> bool:
  """Whether a run behind its plan ends now: the next check (or the planned end, if nearer), then a
  validation and a checkpoint, would end past the budget (less what the loop's clock does not see)."""
  return (elapsed_seconds + steps_to_next_check * costs.step_seconds + costs.eval_seconds
          + costs.save_seconds) > budget_seconds - UNTIMED_SECONDS
