"""The harness: the fixed, read-only part of the built-in GPT target.

Data side: `profiles` (stdlib only) fixes a lab's constants and the data fingerprint;
`data.prepare` fetches a dataset (`sources`, `download`, the generated `demo` corpus),
trains the tokenizer (`tokenizer`) and writes the token cache (`cache`); `loader` packs
cached documents into training and validation batches. Model side: `accel`, `evaluate`,
`tune`. Submodules are imported on use, so importing this package stays cheap (the fleet
runner and the CLI import it). docs/harness-data.md describes the data side in full.
"""
