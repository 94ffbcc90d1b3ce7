"""The overload benchmark's policies: the product and its ablations, as [gateway] settings.

Declared here, not in bench/overload.py, so that the live run, the simulator's replay of it
(bench/overload_sim.py, bench/overload_replay.py) and the summary keys built on that replay
(bench/harness/overload_keys.py) read one table without importing each other in a circle.
"""

from __future__ import annotations

from typing import Any

UNBOUNDED = 10**8
"""A queue token budget no window reaches (every policy but the bounded queue)."""
POLICIES: dict[str, dict[str, Any]] = {
    "admission": {"admission": True, "drop_predicted_late": True, "queue_order": "deadline", "shed_by_cost": True},
    "edf_late_drop": {"admission": False, "drop_predicted_late": True, "queue_order": "deadline",
                      "shed_by_cost": False},
    "fcfs_late_drop": {"admission": False, "drop_predicted_late": True, "queue_order": "arrival",
                       "shed_by_cost": False},
    "edf_bounded": {"admission": False, "drop_predicted_late": False, "queue_order": "deadline", "shed_by_cost": False},
    "edf_expiry": {"admission": False, "drop_predicted_late": False, "queue_order": "deadline", "shed_by_cost": False},
}


def knobs(name: str, classes_ms: tuple[float, ...], shed_by_cost: str, **extra: Any) -> dict[str, Any]:
    """Policy `name`'s [gateway] settings for deadline classes `classes_ms`: the product's shed_by_cost as
    asked ("on" or "off"), the ablations' off; `extra` over all."""
    product = {"shed_by_cost": shed_by_cost == "on"} if name == "admission" else {}
    return {**POLICIES[name], "max_queue_tokens": UNBOUNDED, "score_deadline_ms": int(max(classes_ms)),
            **product, **extra}
