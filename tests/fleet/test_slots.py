"""How many experiments a tier runs at once: one rule, the fleet's (issue 33: `tier_slots` re-derived it)."""

from __future__ import annotations

from nightlab.config import parse_config
from nightlab.fleet.slots import build_slots, tier_slot_count
from nightlab.ledger import Worker, WorkerState

CONFIG = parse_config(
    {
        "target": {"command": "python train.py", "editable": ["train.py"]},
        "fleet": {
            "pool": [
                {"backend": "local", "tier": "cpu", "slots": 1},
                {"backend": "local", "tier": "gpu", "gpus": [0, 2, 3]},
            ]
        },
    }
)


def worker(name: str, tier: str, state: WorkerState) -> Worker:
    return Worker(
        name=name, tier=tier, backend="local", state=state, experiment_id=None, info={}, updated_at=0.0
    )


def test_without_a_controller_the_config_s_slots_count():
    assert tier_slot_count(CONFIG, "cpu") == 1
    assert tier_slot_count(CONFIG, "gpu") == 3  # one per GPU, as build_slots gives them
    slots, _ = build_slots(CONFIG)
    assert [s.name for s in slots if s.tier == "gpu"] == ["gpu-gpu0", "gpu-gpu2", "gpu-gpu3"]


def test_a_running_controller_s_slots_count_so_its_cpu_slots_are_honoured():
    # `fleet start --cpu-slots 2` registered two cpu workers although the config says one
    live = [worker("cpu-0", "cpu", WorkerState.BUSY), worker("cpu-1", "cpu", WorkerState.IDLE)]
    assert tier_slot_count(CONFIG, "cpu", live) == 2
    assert tier_slot_count(CONFIG, "gpu", live) == 3  # no live worker of that tier: the config's rule


def test_a_stopped_controller_s_workers_do_not_count():
    stopped = [worker(f"cpu-{i}", "cpu", WorkerState.STOPPED) for i in range(4)]
    assert tier_slot_count(CONFIG, "cpu", stopped) == 1


def test_a_multi_gpu_cluster_counts_one_slot_per_gpu():
    config = parse_config(
        {
            "target": {"command": "python train.py", "editable": ["train.py"]},
            "fleet": {
                "pool": [{"backend": "skypilot", "tier": "h100", "workers": 2, "accelerators": "H100:8"}]
            },
        }
    )
    assert tier_slot_count(config, "h100") == 16
    assert len(build_slots(config)[0]) == 16
