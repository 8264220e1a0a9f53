"""Search: knobs of the training script, search spaces, experiment designs, verdicts, effects, strategies.

Everything here is pure logic over plain values (no ledger, no fleet): the lab and the CLI feed
it results and act on what it returns. Heavy libraries (optuna, statsmodels, pyDOE3, scipy,
matplotlib, numpy) are imported inside the functions that need them. The package re-exports
nothing: import the submodule you need (`nightlab.search.decide`, `.knobs`, ...), so that reading
a verdict does not pay for loading the strategies and designs.
"""
