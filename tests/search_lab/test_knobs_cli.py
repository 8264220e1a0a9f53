"""`nightlab knobs` and knob rewriting in the snapshots of a sweep: only the value changes."""

from __future__ import annotations

import json
import subprocess

from labkit import nightlab


def test_knobs_lists_constants_with_values_and_types(quick_lab):
    lab = quick_lab()
    train = lab / "train.py"
    train.write_text(
        train.read_text().replace(
            "NOISE = 0.01", "NOISE = 0.01\nBATCH = 2**17  # tokens\nBETAS = (0.8, 0.95)\nFLAG = True"
        )
    )
    rows = json.loads(nightlab("knobs", "--json", cwd=lab).stdout)
    by_name = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == ["LR", "SLEEP", "MODE", "NOISE", "BATCH", "BETAS", "FLAG", "GATE"]
    assert by_name["LR"] == {"name": "LR", "source": "0.01", "type": "float", "file": "train.py", "line": 7}
    assert by_name["MODE"]["type"] == "str" and by_name["MODE"]["source"] == '"ok"'
    assert (by_name["BATCH"]["source"], by_name["BATCH"]["type"]) == ("2**17", "int")
    assert by_name["BETAS"]["type"] == "tuple" and by_name["FLAG"]["type"] == "bool"
    table = nightlab("knobs", cwd=lab).stdout
    assert "BATCH" in table and "2**17" in table and "train.py:11" in table


def test_sweep_rewrites_only_the_value_bytes(quick_lab):
    lab = quick_lab()
    original = (lab / "train.py").read_bytes()
    out = json.loads(nightlab("sweep", "LR=0.02,0.03", "-m", "lr", "--json", cwd=lab).stdout)
    cand = [e for e in out["experiments"] if e["source"] == "sweep"]
    assert sorted(e["params"]["LR"] for e in cand) == ["0.02", "0.03"]
    for e in cand:
        snap = subprocess.run(
            ["git", "show", f"refs/nightlab/{e['id']}:train.py"], cwd=lab, capture_output=True, check=True
        ).stdout
        expected = original.replace(
            b"LR = 0.01  # learning rate", f"LR = {e['params']['LR']}  # learning rate".encode()
        )
        assert snap == expected
    assert (lab / "train.py").read_bytes() == original  # the working tree is never touched
