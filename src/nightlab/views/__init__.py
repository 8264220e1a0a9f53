"""The `--json` documents of the read commands, built in one place.

The CLI prints them (`nightlab results/show/status/effects --json`) and the dashboard serves the
same ones, so an agent reading either sees the same fields. Each builder takes an open lab (a
`nightlab.lab.Lab` or the dashboard's `ReadOnlyLab`: anything with `path`, `config`, `ledger`
and `head()`) and returns plain data; nothing here prints or imports the CLI or the web app.

Other read commands emit a domain object's own `to_dict()` (`Wave`, `WaveStatus`, the doctor's
`Report`, the journal): that object is then the one place their document is built.
"""

from nightlab.views.effects import effects_payload, predicted_best
from nightlab.views.results import every_result_payload, result_row, results_payload
from nightlab.views.show import TAIL_LINES, show_payload
from nightlab.views.status import controller_state, expected_seconds, fleet_state

__all__ = [
    "TAIL_LINES",
    "controller_state",
    "effects_payload",
    "every_result_payload",
    "expected_seconds",
    "fleet_state",
    "predicted_best",
    "result_row",
    "results_payload",
    "show_payload",
]
