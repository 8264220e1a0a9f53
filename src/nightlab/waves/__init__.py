"""Waves in the lab: sweeps, noise-floor runs and promotions, recorded in the ledger and analysed.

`nightlab.search` holds the pure logic (spaces, designs, verdicts, effects); this module runs it
against a lab. Every wave is a ledger row (`waves`) whose `spec` holds what is needed to analyse
or resume it later: the search spaces, the design, the runs asked for, the design points that
reused an earlier measurement, and (for promotions) where each candidate came from.

    wave = submit_sweep(lab, ["LR=log(0.005,0.05)", "WD=0,0.1"], design="full", description="lr x wd")
    lab.wait([e.id for e in wave.experiments])
    result, values = wave_effects(lab, wave.wave.id)

Modules: `_submit` (sweeps, noise-floor runs, the incumbent's re-measurements, repeats),
`_promote` (re-running screened candidates on another tier, picked by `Judge.screened`) and
`_read` (a wave's runs, its candidates by `is_candidate`, effects, noise tables).

Choices:
- A wave is built around the incumbent: the files of HEAD, not the working tree, so uncommitted
  edits never leak into a sweep.
- A design point whose exact files were already measured on the tier with seed 0 (typically the
  incumbent's own point) is not run again: the earlier measurement is reused for the wave and
  listed in `spec["reused"]`. With `--repeats N` every point gets N fresh seeds instead.
- The incumbent is re-run inside the wave, first in the queue, when it has no run on the tier or
  its latest run is older than `[search] incumbent_max_age_waves` waves on that tier; those runs
  have source `remeasure` and are not candidates.
- Verdicts of members that finished before the incumbent had a figure are filled in by the
  controller's judge when the incumbent's runs end (`Judge.refresh_pending`); reading a wave writes
  nothing.
"""

from __future__ import annotations

from nightlab.waves._promote import promote, promote_wave
from nightlab.waves._read import (
    SnapshotFigure,
    WaveStatus,
    default_plot_path,
    is_candidate,
    noise_table,
    wave_effects,
    wave_points,
    wave_runs,
    wave_status,
)
from nightlab.waves._submit import (
    SubmittedWave,
    head_knobs,
    noise,
    parse_spaces,
    submit_incumbent,
    submit_repeats,
    submit_sweep,
    submit_wave,
)

__all__ = [
    "SnapshotFigure",
    "SubmittedWave",
    "WaveStatus",
    "default_plot_path",
    "is_candidate",
    "head_knobs",
    "noise",
    "noise_table",
    "parse_spaces",
    "promote",
    "promote_wave",
    "submit_incumbent",
    "submit_repeats",
    "submit_sweep",
    "submit_wave",
    "wave_effects",
    "wave_points",
    "wave_runs",
    "wave_status",
]
