"""The scheduling policy the gateway serves with and the simulator replays: one set of functions.

Pure: no I/O, no asyncio, no clock of its own. Callers pass the queue, the time (`now_s`, seconds
on their own monotonic clock, the clock deadlines are kept on) and the predictions (a cost model,
how busy the workers are); the functions return decisions. gateway/admission.py and
gateway/batcher.py are thin async shells around them and loadgen/simulator.py drives them from its
event loop, so a setting tuned offline means the same thing live. deadline_queue.py (the queue and
what it reads of a job), cost.py (what it reads of a latency prediction) and drops.py (the drop
reasons) hold the vocabulary; admission.py and batching.py the decisions.

  admission  precheck: the queue's predicted wait alone misses the deadline (refused before any
             tokenizing); admit: the queue's token budget is spent (429 queue_full) or the
             predicted finish is past the deadline (503 deadline_unmeetable). Predicted finish =
             the soonest-free worker's work in flight + the queued work and this request's, in full
             batches shared by the ready workers, + margin + learnt lateness. A probe is admitted
             anyway while no measured batch has confirmed the start-up profile and nothing else is
             queued or running (refusing everything would never produce the measurements).
  batching   one deadline-ordered queue per workload; a batch takes jobs in deadline order up to
             the compiled bounds, looking past at most SCAN_LIMIT jobs that do not fit; a partial
             batch waits while its worker is predicted busy for longer than max_batch_wait_ms.
  drops      one set of reasons (DropReason, answered with DROP_CODES); expired_in_queue, predicted_late (the batch would
             finish past a member's deadline behind the worker's work in flight), the worker's
             expired_in_worker and worker_overdue (no answer within the grace after the deadline)
             are all answered 504 deadline_exceeded.
Without deadline predictions (`AdmissionSettings.predict` false: the FCFS ablation) nothing is
refused for its deadline and nothing dropped as predicted late; the queue budget still holds and
requests still expire at their deadline.
"""

from shared.policy.admission import (AdmissionSettings, Lateness, PoolView, Prediction, admit, finish_ms, is_probe,
                                     precheck)
from shared.policy.batching import (MIN_HOLD_MS, SCAN_LIMIT, BatchBounds, Hold, Send, busy_ms, chunk_bounds,
                                    dispatch, form_batch, least_busy, take_expired)
from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, Work
from shared.policy.drops import DROP_CODES, DropReason, Refusal

__all__ = [
    "DROP_CODES", "DropReason", "MIN_HOLD_MS", "SCAN_LIMIT", "AdmissionSettings", "BatchBounds", "CostModel",
    "DeadlineQueue", "Hold", "Lateness", "PoolView", "Prediction", "Refusal", "Send", "Work", "admit",
    "busy_ms", "chunk_bounds", "dispatch", "finish_ms", "form_batch", "is_probe", "least_busy", "precheck",
    "take_expired",
]
