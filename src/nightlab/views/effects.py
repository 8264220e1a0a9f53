"""The `nightlab effects --json` document: a wave's fitted factor effects (the dashboard's wave page too)."""

from __future__ import annotations

from typing import Any


def predicted_best(result: Any, values: dict) -> dict[str, str]:
    """The fit's best setting per factor, in the values the wave used (coded when it has none)."""
    return {f: values.get(f, {}).get(x, f"{x:+g} (coded)") for f, x in result.predicted_best.items()}


def effects_payload(result: Any, values: dict, metric: str, plot: str | None) -> dict[str, Any]:
    """The `--json` document of `nightlab effects`."""
    return {
        "factors": list(result.factors),
        "runs": result.n_runs,
        "crashed": result.crashed,
        "pending": result.pending,
        "message": result.message,
        "intercept": result.intercept,
        "terms": [
            {
                "term": t.term,
                "coefficient": t.coefficient,
                "effect": t.effect,
                "std_error": t.std_error,
                "p_value": t.p_value,
            }
            for t in result.terms
        ],
        "dropped": list(result.dropped),
        "residual_dof": result.residual_dof,
        "r_squared": result.r_squared,
        "predicted_best": predicted_best(result, values) if result.predicted_best else None,
        "predicted_" + metric: result.predicted_metric,
        "plot": plot,
    }
