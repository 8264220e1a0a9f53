"""Targets that ship with nightlab.

`gpt` is the built-in target: the `train.py` and `program.md` templates that `nightlab init
--profile NAME` copies into a new lab (with the profile's `train_defaults` applied to the
knobs). Any autoresearch-style repository is a target too, unchanged; it needs nothing here.
"""
