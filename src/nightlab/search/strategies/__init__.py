"""Search strategies and the automatic research loop, as pure logic over callables.

A strategy turns the incumbent's knobs and the history of finished runs into the next wave of
proposals (knob -> source text for the searched knobs only; everything else stays as in the
incumbent). Strategies keep no state that the history cannot rebuild, so a search interrupted
at any point resumes by handing a fresh strategy the history from the ledger. One module each:

- `factorial.FactorialStrategy`: a two-level design (full, or the highest-resolution fraction that
  fits the wave) centred on the incumbent at +-step in coded units; the step halves after every
  wave without an adoption and the search stops once it falls below `min_step`.
- `bayesian.OptunaStrategy`: Optuna's TPE (with the constant liar) or GP sampler through
  ask-and-tell, k trials in flight at once, results told back as they arrive. On resume the
  history is replayed into a fresh in-memory study with `add_trial`, so no Optuna storage is kept.
- `greedy.GreedyStrategy`: the autoresearch baseline, a sequential one-knob-at-a-time hill climb:
  try each knob one step up and one step down from the incumbent; after all moves at a step
  failed, halve the step.
- `pattern.PatternStrategy`: the parallel counterpart of greedy, with a model step: each wave is a
  stencil (each knob one step up and down from a centre), a parabola per knob gives the next
  centre, measured with repeats.
- `surface.SurfaceStrategy`: a quadratic model with interactions fitted on every run, pair
  corners to measure the interactions, and a trust region.

`_base` holds what they share (`Observation`, `BaseStrategy`, steps, stencils, replicate groups);
`factory.make_strategy` picks one by name; `loop.run_loop` is `nightlab search` without the lab.
Importing this package loads neither Optuna nor numpy: `SurfaceStrategy` (numpy) is imported on
first use, as optuna's own lazy extras are.
"""

from nightlab.search.strategies._base import BaseStrategy, Knobs, Observation, replicate_groups, stencil
from nightlab.search.strategies.bayesian import OptunaStrategy
from nightlab.search.strategies.factorial import FactorialStrategy
from nightlab.search.strategies.factory import make_strategy
from nightlab.search.strategies.greedy import GreedyStrategy
from nightlab.search.strategies.loop import LoopResult, WaveSummary, run_loop
from nightlab.search.strategies.pattern import PatternStrategy

__all__ = [
    "BaseStrategy",
    "FactorialStrategy",
    "GreedyStrategy",
    "Knobs",
    "LoopResult",
    "Observation",
    "OptunaStrategy",
    "PatternStrategy",
    "SurfaceStrategy",
    "WaveSummary",
    "make_strategy",
    "replicate_groups",
    "stencil",
    "run_loop",
]


def __getattr__(name: str) -> object:
    if name == "SurfaceStrategy":
        from nightlab.search.strategies.surface import SurfaceStrategy

        return SurfaceStrategy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
