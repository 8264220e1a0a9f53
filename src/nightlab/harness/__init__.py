"""The harness: the fixed, read-only part of the built-in GPT target.

`profiles` (stdlib only) fixes a lab's constants and the data fingerprint; `data` prepares
and caches datasets; `tokenizer` trains and loads the BPE tokenizer; `loader` packs token
documents into training and validation batches. Submodules are imported on use, so
importing this package stays cheap (the fleet runner and the CLI import it).
"""
