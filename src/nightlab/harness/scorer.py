"""The scorer: val_bpb of a handed-in model, computed apart from the experiment's code.

DO NOT CHANGE without bumping the data format: every built-in-target result is measured here.

Runs as `python -P -m nightlab.harness.scorer --handoff DIR --lab LAB --out score.json` (the
fleet's supervisor, `attempt.py`, calls `score()` in its own process the same way). `-P`
(`names.ISOLATED`) keeps the lab's folder off the import path, so no Python from the lab runs
here: the model arrives as a `torch.export` program (ATen operators and tensors only).

Loading an untrusted `.pt2` safely. `torch.export.load` unpickles some entries
(`torch.load(weights_only=False)` for pickled weights and sample inputs, `pickle.loads` for opaque
constants), `exec`s the program's `guards_code`, and resolves node targets by name on the `torch`
module (`torch.os.system` resolves). So before loading, `check_archive` reads the archive's JSON
and refuses: any pickled weight or constant, custom or opaque objects, guards code, symbolic
shapes, sample inputs that need more than `weights_only=True`, files it does not know, and any
node whose target is not an ATen / prims operator or `operator.getitem`. After loading, a program
that mutates buffers or returns more than the logits is refused too (a stateful model could tell
the first batches from the rest).

The metric is `evaluate.py`'s: nats over scored bytes / ln 2, special tokens excluded, on the
profile's fixed validation rows. The causality probe is hidden among them: for a few validation
rows chosen at random (from os.urandom, so not predictable) a copy is made whose tokens after a
random position t are replaced with the same positions of another validation row (real text, not
noise), and the copies are shuffled in among the ordinary rows. Copies are not scored. Afterwards,
each copy's per-position log-prob, log-sum-exp and max logit up to t are compared with its
original's: a model that reads the future (in its row or across the batch) changes them. A model
cannot tell a copy from an ordinary row: both are validation text in ordinary batches, at random
positions of the stream.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab.atomic import atomic_write_json
from nightlab.errors import NightlabError
from nightlab.harness.names import HANDOFF_META, MODEL_FILE

__all__ = ["UnscorableModelError", "check_archive", "load_program", "score"]

PROBE_ROWS_MAX = 8  # copies hidden among the rows; each one checks one scored row
_ALLOWED_PREFIXES = ("torch.ops.aten.", "torch.ops.prims.")
_ALLOWED_TARGETS = {"_operator.getitem"}
_ALLOWED_TREE_TYPES = {None, "builtins.tuple", "builtins.list", "builtins.dict"}


class UnscorableModelError(NightlabError):
    """The handed-in file is not a program the harness will run (the message says why)."""


# ---------------------------------------------------------------------------
# Safe loading


def _tree_types(spec: str) -> set[Any]:
    """Type names in a serialized pytree spec (`[version, {"type": ..., "children_spec": [...]}]`)."""
    found: set[Any] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.add(node.get("type"))
            for child in node.get("children_spec", []):
                walk(child)

    try:
        walk(json.loads(spec)[1])
    except (ValueError, IndexError, TypeError):
        found.add("<unreadable>")
    return found


def check_archive(path: Path) -> None:
    """Refuse any `.pt2` whose loading could run code or whose program is not plain ATen.

    Raises:
        UnscorableModelError: naming the first thing refused.
    """
    import torch

    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise UnscorableModelError(f"`{path.name}` is not a torch.export archive ({e})") from e
    with archive:
        names = archive.namelist()
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1:
            raise UnscorableModelError(f"`{path.name}` has {len(roots)} top folders; expected one")
        root = roots.pop()
        models = []
        for name in names:
            rel = name.split("/", 1)[1] if "/" in name else ""
            if rel in ("archive_format", "archive_version", "byteorder") or rel.startswith(".data/"):
                continue
            if rel.startswith("data/weights/") or rel.startswith("data/constants/tensor_"):
                continue
            if rel.endswith("_config.json") and rel.startswith(("data/weights/", "data/constants/")):
                continue
            if rel == "data/constants/model_constants_config.json":
                continue
            if rel.startswith("data/sample_inputs/") and rel.endswith(".pt"):
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as e:
                    raise UnscorableModelError(
                        f"sample inputs `{rel}` need a full unpickler ({type(e).__name__}); refused"
                    ) from e
                continue
            if rel.startswith("models/") and rel.endswith(".json"):
                models.append(name)
                continue
            raise UnscorableModelError(
                f"`{path.name}` holds `{rel}`, which the scorer does not load; refused"
            )
        if [m.split("/", 1)[1] for m in models] != ["models/model.json"]:
            raise UnscorableModelError(f"`{path.name}` must hold exactly one program, `models/model.json`")
        for config in (
            "data/weights/model_weights_config.json",
            "data/constants/model_constants_config.json",
        ):
            try:
                entries = json.loads(archive.read(f"{root}/{config}"))["config"]
            except KeyError:
                raise UnscorableModelError(f"`{path.name}` lacks `{config}`") from None
            for fqn, meta in entries.items():
                if meta.get("use_pickle") or not str(meta.get("path_name", "")).startswith(
                    ("weight_", "tensor_")
                ):
                    raise UnscorableModelError(f"`{fqn}` is stored as a pickled or custom object; refused")
        program = json.loads(archive.read(models[0]))
    if program.get("guards_code"):
        raise UnscorableModelError("the program carries guard code, which loading would execute; refused")
    if program.get("range_constraints"):
        raise UnscorableModelError("the program has symbolic shapes; export it with static shapes")
    graph = program["graph_module"]["graph"]
    for key in ("sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values"):
        if graph.get(key):
            raise UnscorableModelError(f"the program uses {key.replace('_values', '')}s; refused")
    for node in graph["nodes"]:
        target = node.get("target", "")
        if not (target.startswith(_ALLOWED_PREFIXES) or target in _ALLOWED_TARGETS):
            raise UnscorableModelError(f"the program calls `{target}`, not a PyTorch operator; refused")
    for entry in program["graph_module"].get("module_call_graph", []):
        signature = entry.get("signature") or {}
        for spec in (signature.get("in_spec"), signature.get("out_spec")):
            if spec and not _tree_types(spec) <= _ALLOWED_TREE_TYPES:
                raise UnscorableModelError("the program's inputs or outputs are not plain tensors; refused")


def load_program(path: Path) -> Any:
    """Check, load and prepare a handed-in program; returns a callable `f(x) -> logits`.

    Raises:
        UnscorableModelError: the archive was refused or does not load.
    """
    import torch
    from torch.export.graph_signature import OutputKind

    check_archive(path)
    try:
        program = torch.export.load(path)
    except Exception as e:
        raise UnscorableModelError(
            f"torch.export.load failed on `{path.name}`: {type(e).__name__}: {e}"
        ) from e
    outputs = program.graph_signature.output_specs
    if [o.kind for o in outputs] != [OutputKind.USER_OUTPUT]:
        raise UnscorableModelError("the program must return only the logits and mutate no buffer; refused")
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        # dtype assertions recorded at export time would refuse the bf16 autocast the scorer
        # applies on GPUs; they check nothing about the result
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default:
            graph.erase_node(node)
    program.graph_module.recompile()
    return program.module()


# ---------------------------------------------------------------------------
# Scoring


def _autocast(device: str) -> Any:
    import contextlib

    import torch

    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _row_stats(logits: Any, y: Any) -> tuple[Any, Any]:
    """Per position: (nats of the target, [log-prob, logsumexp, max logit]) for the probe."""
    import torch

    lse = torch.logsumexp(logits, dim=-1)
    target = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    nats = lse - target
    return nats, torch.stack([target - lse, lse, logits.max(dim=-1).values], dim=-1)


def score(handoff: Path, lab: Path, *, data_dir: Path | None = None) -> dict[str, Any]:
    """Score a handed-in model on the lab's validation rows, with the hidden causality probe.

    Args:
        handoff: the folder `hand_in` wrote (`model.pt2`, `handoff.json`).
        lab: the lab whose `nightlab.toml` profile applies (never the snapshot's copy).
        data_dir: the prepared data; default `profiles.data_dir(profile)`.

    Returns:
        The harness-owned summary keys: `val_bpb`, `status` (`ok` / `invalid`), `invalid_reason`,
        `data_fingerprint`, `val_set` (demo), `eval_tokens`, `eval_seconds`, `probe_rows`, plus the clock's figures.
    """
    import torch

    from nightlab.harness.cache import load_manifest
    from nightlab.harness.loader import val_batches
    from nightlab.harness.profiles import data_dir as default_data_dir
    from nightlab.harness.profiles import load_lab_profile
    from nightlab.harness.tokenizer import Tokenizer

    start = time.perf_counter()
    profile = load_lab_profile(lab)
    folder = Path(data_dir) if data_dir is not None else default_data_dir(profile)
    manifest = load_manifest(folder, profile=profile)
    meta = _read_handoff(handoff)
    result = _summary_of_handoff(manifest, meta)
    B = int(meta["batch_size"])
    T = profile.seq_len
    if int(meta.get("seq_len", T)) != T or B < 1:
        raise UnscorableModelError(
            f"the model was exported for ({B}, {meta.get('seq_len')}) rows; need (B, {T})"
        )
    device = str(meta.get("device", "cpu"))
    if device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    model = load_program(handoff / MODEL_FILE)

    token_bytes = torch.as_tensor(Tokenizer.load(folder).token_bytes, dtype=torch.int64, device=device)
    xs, ys = [], []
    for x, y in val_batches(folder, B, T, device, profile.eval_tokens):
        xs.append(x)
        ys.append(y)
    rows = _ProbedRows.hide_probes(torch.cat(xs), torch.cat(ys), B, T)
    total_nats, total_bytes, stats, shape_error = _evaluate(model, rows, token_bytes, B, T, device)
    # A model that fails the probe is still scored: the (too good) number shows what the leak is
    # worth, and the reason travels with it so the fleet records `invalid`, not a result.
    reason = shape_error or _probe_verdict(rows.probes, stats, rows.N)
    if reason:
        result.update(status="invalid", invalid_reason=reason)
    if shape_error is None:
        if total_bytes.item() == 0:
            raise NightlabError("no scored bytes in the validation rows; re-run `nightlab prepare`")
        result["val_bpb"] = round((total_nats / (math.log(2) * total_bytes)).item(), 6)
    result.update(
        eval_tokens=rows.N * T, probe_rows=rows.K, eval_seconds=round(time.perf_counter() - start, 3)
    )
    return result


def _read_handoff(handoff: Path) -> dict[str, Any]:
    """What `hand_in` wrote beside the model (batch shape, device, the clock's figures)."""
    try:
        return json.loads((handoff / HANDOFF_META).read_text())
    except (OSError, ValueError) as e:
        raise UnscorableModelError(
            f"no readable `{HANDOFF_META}` in `{handoff}`; train.py must call hand_in"
        ) from e


def _summary_of_handoff(manifest: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The summary keys known before scoring: the data's fingerprint and validation set, the clock's figures."""
    clock = {k: meta["clock"][k] for k in ("training_seconds", "warmup_seconds", "warmup_steps", "steps")}
    return {
        "status": "ok",
        "data_fingerprint": manifest["fingerprint"],
        # which validation set (demo: drawn from the data folder's secret); the controller
        # refuses a score from another set than its lab's (`owned.apply_score`)
        **({"val_set": manifest["source"]["val_set"]} if "val_set" in manifest.get("source", {}) else {}),
        **clock,
        "export_seconds": meta.get("export_seconds"),
    }


@dataclass
class _ProbedRows:
    """The validation rows with the hidden probe copies shuffled in, in the order they are fed.

    `order` holds k < N for ordinary row k, k >= N for probe copy k - N, and -1 - r for ordinary
    row r repeated as padding (the exported program takes exactly B rows; padding is unscored).
    """

    X: Any
    Y: Any
    Xp: list[Any]
    Yp: list[Any]
    probes: list[tuple[int, int]]  # (original row, cut position t), one per copy
    order: list[int]

    @property
    def N(self) -> int:
        return int(self.X.size(0))

    @property
    def K(self) -> int:
        return len(self.probes)

    @classmethod
    def hide_probes(cls, X: Any, Y: Any, B: int, T: int) -> _ProbedRows:
        """Copies of random rows with a real-text suffix from another row after t, shuffled in."""
        N = X.size(0)
        rng = random.Random(os.urandom(16))
        K = min(PROBE_ROWS_MAX, max(1, N // 8)) if N >= 2 else 0
        probes = []
        Xp, Yp = [], []
        for i in rng.sample(range(N), K):
            t = rng.randrange(T // 4, T - 1)
            j = rng.choice([r for r in range(N) if r != i])
            x, y = X[i].clone(), Y[i].clone()
            x[t + 1 :] = X[j, t + 1 :]
            y[t:] = Y[j, t:]  # y[t] is the token at t + 1: targets stay x shifted by one
            Xp.append(x)
            Yp.append(y)
            probes.append((i, t))
        order = list(range(N + K))  # < N: ordinary rows; >= N: probe copies
        rng.shuffle(order)
        pad = -len(order) % B  # the exported program takes exactly B rows: fill with ordinary rows, unscored
        order += [-1 - r for r in rng.sample(range(N), pad)] if pad <= N else [-1] * pad
        return cls(X, Y, Xp, Yp, probes, order)

    def row(self, k: int) -> tuple[Any, Any]:
        if k >= self.N:
            return self.Xp[k - self.N], self.Yp[k - self.N]
        r = k if k >= 0 else -1 - k
        return self.X[r], self.Y[r]


def _evaluate(
    model: Any,
    rows: _ProbedRows,
    token_bytes: Any,
    B: int,
    T: int,
    device: str,
) -> tuple[Any, Any, dict[int, Any], str | None]:
    """Feed every row in order: nats and bytes of the scored rows, the probe statistics of the
    watched ones (originals and copies), and the shape error that stopped it (None when none)."""
    import torch
    import torch.nn.functional as F

    N, V = rows.N, token_bytes.numel()
    watched = {i for i, _ in rows.probes} | {N + p for p in range(rows.K)}
    stats: dict[int, Any] = {}
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    with torch.no_grad():
        for b in range(0, len(rows.order), B):
            keys = rows.order[b : b + B]
            x = torch.stack([rows.row(k)[0] for k in keys])
            y = torch.stack([rows.row(k)[1] for k in keys])
            with _autocast(device):
                out = model(x)
            shape = tuple(getattr(out, "shape", ()))
            if len(shape) != 3 or shape[:2] != (B, T) or shape[2] < V:
                shape_error = (
                    f"model(x) must return logits of shape (B, T, >= {V}); got {shape or type(out).__name__}"
                )
                return total_nats, total_bytes, stats, shape_error
            logits = out[..., :V].float()
            _, per_pos = _row_stats(logits, y)
            for pos, k in enumerate(keys):
                if k in watched:
                    stats[k] = per_pos[pos]
            scored = torch.tensor([0 <= k < N for k in keys], device=device)
            nbytes = token_bytes[y] * scored[:, None]
            total_nats += (F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none").view(B, T)
                           * (nbytes > 0)).sum(dtype=torch.float64)  # fmt: skip
            total_bytes += nbytes.sum()
    return total_nats, total_bytes, stats, None


def _probe_verdict(probes: list[tuple[int, int]], stats: dict[int, Any], N: int) -> str | None:
    """The first probe whose copy's prefix statistics differ from its original's, as a reason."""
    for p, (i, t) in enumerate(probes):
        ref, got = stats.get(i), stats.get(N + p)
        if ref is None or got is None:
            return "the causality probe lost a row (the model's output was cut short)"
        if not bool(ref[: t + 1].isfinite().all()):
            continue  # not a causality question: val_bpb will be NaN
        # positions < t: everything; at t the target is the changed token x[t + 1], so only the
        # logits' log-sum-exp and max, which a model that peeks at x[t + 1] changes as well
        diff = max((got[:t] - ref[:t]).abs().max().item(), (got[t, 1:] - ref[t, 1:]).abs().max().item())
        ref = ref[: t + 1]
        # identical shapes run identical kernels; the slack covers bf16 kernels that tile differently
        # for other rows in the batch (~1e-3 relative); twice, as log-sum-exp adds two logit errors
        tolerance = 2e-3 * max(1.0, ref[:, 2].abs().max().item())
        if not diff <= tolerance:
            return (
                f"model is not causal: at positions <= {t} its predictions changed by {diff:.3g} "
                f"(tolerance {tolerance:.1g}) when only later tokens changed"
            )
    return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write a result as the harness writes every result: whole or not at all, keys sorted."""
    atomic_write_json(path, data, indent=1, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    """CLI: score a handed-in model and write the result as JSON; exit 0 even when `invalid`."""
    parser = argparse.ArgumentParser(
        prog="python -m nightlab.harness.scorer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--handoff", type=Path, required=True, help="the folder hand_in wrote")
    parser.add_argument("--lab", type=Path, required=True, help="the lab whose profile applies")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON result goes")
    args = parser.parse_args(argv)
    try:
        result = score(args.handoff, args.lab)
    except UnscorableModelError as e:
        result = {"status": "invalid", "invalid_reason": str(e)}
    except NightlabError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    write_json(args.out, result)
    shown = f"val_bpb {result['val_bpb']:.6f}" if "val_bpb" in result else "no val_bpb"
    print(f"nightlab harness: scored {shown}, status {result['status']}", flush=True)
    return 0


if __name__ == "__main__":
    from nightlab.harness.names import exit_now

    exit_now(main())
