"""The built-in GPT pretraining target: templates, not importable code.

- `train.py`: the file agents edit (model, optimizer, loop); it imports the fixed harness
  (`nightlab.harness`) for data, evaluation and the device layer. Never import it: running it
  trains a model.
- `program.md`: the rules an agent follows in a lab (what it may change, the metric, the
  simplicity criterion, the CLI).

Read them with `importlib.resources.files("nightlab.targets.gpt").joinpath("train.py")`.
"""
