"""Search: knobs of the training script, search spaces, experiment designs, verdicts, effects, strategies.

Everything here is pure logic over plain values (no ledger, no fleet): the lab and the CLI feed
it results and act on what it returns. Heavy libraries (optuna, statsmodels, pyDOE3, matplotlib)
are imported inside the functions that need them, so importing this package stays cheap.
"""

from nightlab.search.knobs import Knob, list_knobs, parse_value, set_knobs

__all__ = ["Knob", "list_knobs", "parse_value", "set_knobs"]
