"""The scheduling policy the gateway serves with and the simulator replays: one object, pure functions.

scheduler.py's Scheduler (one per workload) owns the queue, the learnt lateness and every state change
(submit, step, expire, on_answer, on_failed), over job.py's Job, the one job type; the gateway and the
simulator both drive it. The decisions it makes are the functions below.

Pure: no I/O, no asyncio, no clock of its own. Callers pass the queue, the time (`now_s`, seconds
on their own monotonic clock, the clock deadlines are kept on) and the predictions (a cost model,
how busy the workers are); the functions return decisions. gateway/admission.py and
gateway/batcher.py are thin async shells around them and loadgen/simulator.py drives them from its
event loop, so a setting tuned offline means the same thing live. deadline_queue.py (the queue and
what it reads of a job), cost.py (what it reads of a latency prediction) and drops.py (the drop
reasons) hold the vocabulary; admission.py and batching.py the decisions.

  admission  precheck: the predicted wait where the request would run already misses its deadline
             (refused before any tokenizing); admit: the queue's token budget is spent (429
             queue_full) or the predicted finish is past the deadline (503 deadline_unmeetable).
             Predicted finish (`place`) = the soonest-free worker's work in flight, then the queued
             jobs served before it (in deadline order: those due no later), skipping those the
             batcher will drop as late, in full batches shared by the ready workers, then itself;
             plus margin and the batcher's learnt lateness (`Lateness`: how late answers come against
             the finish predicted at send: the event loop's present lag, and a percentile of the
             rest), the slack its drops use: admission refuses what the
             batcher would drop were the queue to stay as it is. A probe is admitted anyway while
             nothing else is queued or running and the start-up profile is unconfirmed or only the
             learnt lateness refuses it.
  batching   one queue per workload, served in deadline order (or arrival order: an ablation); a
             batch is sent only when its worker is predicted free within max_batch_wait_ms plus the
             loop's present lag (until then a later, tighter deadline can still join or pass it); it
             takes jobs in serving order up to the compiled bounds, looking past at most SCAN_LIMIT
             that do not fit, and, with predicted-late drops on, only companions that keep every
             member in time; a job that cannot finish in time even alone is dropped before compute.
  by cost    with shed_by_cost (on by default), under overload only: when the queue served in
             order cannot finish every job in time, `shed_costliest` (Moore and Hodgson's rule)
             picks the costliest per answer to give up, not the latest in the order; admission
             refuses a request it picks (and admits one that gets in by shedding a costlier queued
             job), the batcher drops the picked jobs before compute (predicted_late). Large
             requests are the first shed.
  routing    (routing.py) score batches are formed per worker from the jobs placed on it: a shared
             prefix goes back to the worker that got it last while that is in time, else to its
             owners on a consistent-hash ring under a load bound, else to the least busy
             (`dispatch_routed`, the batcher's and the simulator's step).
  drops      one set of reasons (DropReason, answered with DROP_CODES); expired_in_queue, predicted_late (it
             cannot finish in time behind the worker's work in flight), the worker's
             expired_in_worker and worker_overdue (no answer within the grace after the deadline)
             are all answered 504 deadline_exceeded.
Each part can be turned off for baselines: early refusal (`AdmissionSettings.refuse_early`), the
predicted-late drops (`dispatch(drop_late=...)`) and deadline order (`QueueOrder.ARRIVAL`); the
queue budget always holds and requests always expire at their deadline.
"""

from shared.policy.admission import (ADMIT_SHED_GAIN, AdmissionSettings, Lateness, PoolView, Prediction, PresentLag,
                                     admit, finish_ms, is_probe, place, precheck)
from shared.bounds import BatchBounds
from shared.policy.batching import (MIN_HOLD_MS, SCAN_LIMIT, Hold, Send, FinishEstimate, busy_ms, dispatch, form_batch,
                                    least_busy, shed_costliest, take_expired)
from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, QueueOrder, Work
from shared.policy.drops import DROP_CODES, SENT_AND_MISSED, DropReason, Refusal

__all__ = [
    "DROP_CODES", "SENT_AND_MISSED", "DropReason", "MIN_HOLD_MS", "SCAN_LIMIT", "ADMIT_SHED_GAIN", "AdmissionSettings", "BatchBounds",
    "CostModel", "DeadlineQueue", "Hold", "Lateness", "PoolView", "Prediction", "PresentLag", "QueueOrder", "Refusal", "Send",
    "FinishEstimate", "Work", "admit", "busy_ms", "dispatch", "finish_ms", "form_batch", "is_probe",
    "least_busy", "place", "precheck", "shed_costliest", "take_expired",
]
