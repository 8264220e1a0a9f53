"""Search: knobs of the training script, search spaces, experiment designs, verdicts, effects, strategies.

Everything here is pure logic over plain values (no ledger, no fleet): the lab and the CLI feed
it results and act on what it returns. Heavy libraries (optuna, statsmodels, pyDOE3, scipy,
matplotlib, numpy) are imported inside the functions that need them, so importing this package
costs only the standard library.
"""

from nightlab.search.decide import Decision, adjusted_z, best_of_wave, verdict
from nightlab.search.designs import Design, fractional_factorial, full_factorial, random_design
from nightlab.search.effects import EffectsResult, estimate_effects, plot_main_effects
from nightlab.search.knobs import Knob, list_knobs, parse_value, set_knobs
from nightlab.search.spaces import SPACE_FORMS, Dimension, check_knobs, parse_space
from nightlab.search.strategies import BaseStrategy, Observation, make_strategy, run_loop

__all__ = [
    "SPACE_FORMS",
    "BaseStrategy",
    "Decision",
    "Design",
    "Dimension",
    "EffectsResult",
    "Knob",
    "Observation",
    "adjusted_z",
    "best_of_wave",
    "check_knobs",
    "estimate_effects",
    "fractional_factorial",
    "full_factorial",
    "list_knobs",
    "make_strategy",
    "parse_space",
    "parse_value",
    "plot_main_effects",
    "random_design",
    "run_loop",
    "set_knobs",
    "verdict",
]
