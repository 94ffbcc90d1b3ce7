"""The scheduling policy driven with a fake clock: admission, batch formation, holds and drops."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared.latency_correction import CorrectedModel
from shared.latency_model import LatencyModel
from shared.work import chunk_bounds
from shared.policy import (ADMIT_SHED_GAIN, DROP_CODES, SCAN_LIMIT, AdmissionSettings, BatchBounds, DeadlineQueue, Hold, Lateness,
                           PresentLag,
                           PoolView, Prediction, QueueOrder, Refusal, Send, admit, busy_ms, dispatch,
                           form_batch, place, precheck, shed_costliest, take_expired)

SCORE = BatchBounds(max_items_per_batch=8, max_tokens_per_batch=100, max_labels=2)
IDLE = PoolView(ready_workers=1, soonest_free_ms=0.0, batches_in_flight=0)
SETTINGS = AdmissionSettings(max_queue_tokens=1000, margin_ms=1.0)


@dataclass(eq=False)
class FakeJob:
    """The fields the policy reads, as shared/policy/job.py's Job has them."""

    deadline: float
    samples: int = 1
    tokens: int = 10
    label_ids: tuple[int, ...] = ()
    beam_key: tuple[int, int, int] | None = None
    priority: int = 0

    @property
    def batch_items(self) -> int:
        return self.beam_key[0] if self.beam_key else self.samples

    @property
    def latency_tokens(self) -> int:
        return self.batch_items * self.tokens if self.beam_key else self.tokens


def model(ms_per_item: float = 1.0, fixed_ms: float = 2.0, verified: bool = True) -> CorrectedModel:
    """T = fixed + ms_per_item * B; confirmed by three measured batches unless `verified` is False."""
    corrected = CorrectedModel(LatencyModel(0.0, 0.0, ms_per_item, fixed_ms), 8, 100)
    if verified:
        for _ in range(3):
            corrected.observe(4, 10, fixed_ms + 4 * ms_per_item, fixed_ms + 4 * ms_per_item)
    return corrected


def queue_of(*jobs: FakeJob) -> DeadlineQueue:
    queue = DeadlineQueue()
    for job in jobs:
        queue.push(job)
    return queue


def test_the_queue_keeps_deadline_order_and_totals():
    a, b, c = FakeJob(3.0, tokens=5), FakeJob(1.0, samples=2, tokens=7), FakeJob(3.0, tokens=1)
    queue = queue_of(a, b, c)
    assert list(queue.in_order()) == [b, a, c]           # equal deadlines keep arrival order
    assert (queue.jobs, queue.tokens, queue.items) == (3, 13, 4)
    assert queue.remove(a) and not queue.remove(a)       # a second removal is a no-op
    assert a not in queue and c in queue and queue.earliest_deadline() == 1.0
    assert (queue.jobs, queue.tokens, queue.items) == (2, 8, 3)


def test_admit_predicts_the_finish_where_the_request_runs_in_deadline_order():
    earlier, later = FakeJob(0.5, samples=4), FakeJob(10.0, samples=4)
    queue = queue_of(earlier, later)
    busy = PoolView(ready_workers=1, soonest_free_ms=5.0, batches_in_flight=1)
    decision = admit([FakeJob(1.0, samples=4)], queue, busy, model(), now_s=0.0, settings=SETTINGS,
                     lateness=Lateness())
    # 5 ms in flight, then the earlier job and itself in one full batch of 8 (2 + 8 ms); the later
    # job runs after it and does not count; its service alone is 2 + 4 ms
    assert isinstance(decision, Prediction)
    assert decision.finish_at == pytest.approx(0.015) and decision.service_ms == pytest.approx(6.0)
    assert decision.wait_ms == pytest.approx(9.0) and decision.budget_ms == pytest.approx(1000.0)


def test_a_tight_deadline_is_admitted_ahead_of_a_long_queue_of_loose_ones():
    loose = queue_of(*(FakeJob(0.300, samples=8) for _ in range(10)))   # 10 full batches: 100 ms of work
    tight = FakeJob(0.050, samples=4)
    assert isinstance(admit([tight], loose, IDLE, model(), 0.0, SETTINGS, Lateness()), Prediction)
    assert precheck(loose, IDLE, model(), 0.050, 0.0, SETTINGS, Lateness()) is None
    due = queue_of(*(FakeJob(0.100, samples=8) for _ in range(10)))     # 9 fit by 100 ms (+ 1 ms margin)
    behind = admit([FakeJob(0.100, samples=8)], due, IDLE, model(), 0.0, SETTINGS, Lateness())
    assert isinstance(behind, Refusal) and "predicted finish in 100.0 ms" in behind.message


def test_place_skips_the_queued_jobs_the_batcher_will_drop():
    doomed = FakeJob(0.003, samples=8)                   # 10 ms alone, due in 3 ms: dropped before compute
    kept = FakeJob(0.050, samples=8)
    assert place(queue_of(doomed, kept), IDLE, model(), 0.0, 0.0, 1.0) == pytest.approx(10.0)
    assert place(queue_of(kept), IDLE, model(), 0.0, 0.0, 1.0, items_new=8, tokens_new=10) == pytest.approx(20.0)
    arrival = DeadlineQueue(QueueOrder.ARRIVAL)          # first come, first served: all of it is ahead
    for job in (FakeJob(0.9, samples=8), FakeJob(0.8, samples=8)):
        arrival.push(job)
    assert place(arrival, IDLE, model(), 0.0, 0.0, 0.1) == pytest.approx(20.0)


def test_admit_refuses_a_deadline_it_cannot_meet_and_learnt_lateness_counts():
    job = FakeJob(0.0065)                                 # 6.5 ms; alone it takes 3 ms + 1 ms margin
    assert isinstance(admit([job], DeadlineQueue(), IDLE, model(), 0.0, SETTINGS, Lateness()), Prediction)
    late = Lateness()
    for _ in range(20):                                   # answers of 6.5 ms budgets come 10 ms late
        late.observe(Prediction(0, 3.0, 6.5, finish_at=1.0), finished_at=1.010)
    assert 5.0 < late.slack_ms(0.0, 1.0) < 12.5                # steps of a quarter of the estimate up to the 10 ms
    running = PoolView(ready_workers=1, soonest_free_ms=0.0, batches_in_flight=1)  # (idle: a probe goes)
    refused = admit([job], DeadlineQueue(), running, model(), 0.0, SETTINGS, late)
    assert isinstance(refused, Refusal) and refused.reason == "deadline_unmeetable"
    assert refused.code == "deadline_unmeetable" and "past the deadline" in refused.message


def test_a_far_off_lateness_comes_back_in_steps_of_its_own_size():
    late = Lateness()
    late.value = 40.0                                      # learnt in a slow spell: 40 ms
    for _ in range(300):                                   # now every answer comes on time
        late.observe(Prediction(0, 5.0, 100.0, finish_at=1.0), finished_at=1.0)
    assert late.slack_ms(0.0, 1.0) < 10.0                       # in fixed 0.25 ms steps: 32.5 ms after 300


def test_a_missed_answer_counts_as_at_least_as_late_as_its_deadline():
    late = Lateness()
    sent = Prediction(0, 3.0, 0.0, finish_at=1.0)
    late.observe_missed(sent, deadline=1.020)             # never answered; due 20 ms after its predicted finish
    assert late.value == pytest.approx(0.25 * 0.98)       # counted as late, a step up
    late.value = 30.0
    late.observe_missed(sent, deadline=1.020)             # 20 ms is below the estimate: unknown, skipped
    assert late.value == 30.0


def test_the_present_lag_counts_at_once_and_is_forgotten_within_a_few_hundred_ms():
    lag = PresentLag(half_life_ms=50.0)
    lag.sample(1.000, 30.0)                              # the loop fired a timer 30 ms late
    assert lag.ms(1.000) == pytest.approx(30.0)
    lag.sample(1.010, 2.0)                               # a smaller lag does not hide the burst's at once
    assert lag.ms(1.010) == pytest.approx(30.0 * 0.5 ** 0.2)
    assert lag.ms(1.050) == pytest.approx(15.0)          # halved every 50 ms since the largest
    assert lag.ms(1.300) < 1.0


def test_after_a_burst_s_lag_has_gone_a_tight_request_that_fits_is_admitted_again():
    """Answers in a burst come 30 ms late because the gateway's loop runs 30 ms late: the slack
    follows the lag while it lasts (a request that would be late is refused) and is gone soon after
    (the percentile beyond it did not learn the lag, so it does not hold it through the lull)."""
    late = Lateness()
    busy = PoolView(ready_workers=1, soonest_free_ms=0.0, batches_in_flight=1)    # not idle: no probe
    for k in range(200):                                 # a burst: 200 answers over 400 ms, each 30 ms late
        now = 1.0 + 0.002 * k
        late.lag.sample(now, 30.0)                       # the loop's timer, as late as the answers
        late.observe(Prediction(0, 20.0, 50.0, finish_at=now - 0.030), finished_at=now)
    during = 1.4
    assert late.value < 5.0                              # the lag is not learnt into the percentile
    job = FakeJob(during + 0.030)                        # 3 ms alone + 1 ms margin: in time but for the lag
    refused = admit([job], DeadlineQueue(), busy, model(), during, SETTINGS, late)
    assert isinstance(refused, Refusal) and refused.reason == "deadline_unmeetable"
    assert isinstance(precheck(DeadlineQueue(), busy, model(), during + 0.030, during, SETTINGS, late, items=1),
                      Refusal)
    after = during + 0.3                                 # the loop is on time again (its timer samples 0)
    late.lag.sample(after, 0.0)
    assert isinstance(admit([FakeJob(after + 0.030)], DeadlineQueue(), busy, model(), after, SETTINGS, late),
                      Prediction)
    assert isinstance(admit([FakeJob(after + 0.050, samples=8)], queue_of(FakeJob(after + 0.040, samples=8)),
                            busy, model(), after, SETTINGS, late), Prediction)   # 50 ms: 10 + 10 ms of work


def test_the_batcher_s_drops_take_the_present_lag_too():
    late = Lateness()
    late.lag.sample(1.0, 30.0)
    during = queue_of(FakeJob(1.025))                    # 1 ms busy + 3 ms alone, due in 25 ms: late behind 30 ms
    plan = dispatch(during, "score", SCORE, model(), 1.0, 2.0, 1.0, slack_ms=late.slack_ms(1.0, 1.0))
    assert isinstance(plan, Send) and plan.late and not plan.live
    after = queue_of(FakeJob(1.325))                     # the same 300 ms later, the loop on time again
    plan = dispatch(after, "score", SCORE, model(), 1.0, 2.0, 1.3, slack_ms=late.slack_ms(1.0, 1.3))
    assert isinstance(plan, Send) and plan.live and not plan.late


@pytest.mark.parametrize("late_every, slack_above, slack_below", [(20, 15.0, 30.0), (100, 0.0, 5.0)])
def test_the_learnt_lateness_covers_all_but_the_slowest_two_percent(late_every, slack_above, slack_below):
    """One answer in 20 (5 %) coming 20 ms late is a tail the slack must cover: sent at the edge, those
    answers would be late and their compute wasted. One in 100 (1 %) is under the 2 % it leaves."""
    late = Lateness()
    for k in range(2000):
        finished_at = 1.020 if k % late_every == 0 else 1.0
        late.observe(Prediction(0, 5.0, 100.0, finish_at=1.0), finished_at=finished_at)
    assert slack_above <= late.slack_ms(0.0, 1.0) < slack_below


@pytest.mark.parametrize("slack_ms", [0.0, 4.0])
@pytest.mark.parametrize("busy_ms", [0.0, 1.5, 7.0])
def test_admission_refuses_exactly_what_the_batcher_would_drop_were_the_queue_to_stay(slack_ms, busy_ms):
    """Admission's check is the batcher's, taken at arrival with the same learnt slack: a request
    admitted is one the batcher sends (the queue staying as it is), one refused it would drop."""
    late = Lateness()
    late.value = slack_ms
    pool = PoolView(ready_workers=1, soonest_free_ms=busy_ms, batches_in_flight=1 if busy_ms else 0)
    queued = [FakeJob(0.020, samples=4), FakeJob(0.300, samples=8)]  # one served first, one after
    for due_ms in (k + 0.5 for k in range(2, 40)):        # never on a boundary (float sums)
        job = FakeJob(due_ms / 1000.0, samples=4)
        queue = queue_of(*queued)
        admitted = isinstance(admit([job], queue, pool, model(), 0.0, SETTINGS, late), Prediction)
        queue.push(job)
        sent, now = False, 0.0
        worker_busy = busy_ms
        while queue and not sent:                          # the batcher's steps, the worker's time advanced
            plan = dispatch(queue, "score", SCORE, model(), worker_busy, 0.0, now, slack_ms=late.slack_ms(1.0, 0.0))
            if isinstance(plan, Hold):
                now, worker_busy = now + worker_busy / 1000.0, 0.0
                continue
            for gone in plan.late + plan.live:
                queue.remove(gone)
            if job in plan.late:
                break
            sent = job in plan.live
            now, worker_busy = plan.finish_at, 0.0
        assert admitted == sent, f"due in {due_ms} ms: admitted {admitted}, sent {sent}"


def test_precheck_refuses_on_the_wait_where_the_request_would_run():
    queue = queue_of(*(FakeJob(0.021, samples=8) for _ in range(3)))   # 3 full batches of 10 ms, due at 21 ms
    # with the 1 ms margin the first two fit (10, 20 ms); the third would end at 30 ms: dropped, no wait.
    # Behind them, one sample of one token at least: 20 + 3 ms, + 1 ms margin, past 23 ms
    refusal = precheck(queue, IDLE, model(), deadline_s=0.023, now_s=0.0, settings=SETTINGS, lateness=Lateness(),
                       items=1)
    assert isinstance(refusal, Refusal) and "is 23.0 ms" in refusal.message
    assert precheck(queue, IDLE, model(), 0.024, 0.0, SETTINGS, Lateness(), items=1) is None
    assert precheck(queue, IDLE, model(), 0.020, 0.0, SETTINGS, Lateness(), items=1) is None  # ahead of them


def test_without_early_refusal_nothing_is_refused_for_its_deadline():
    no_refusal = AdmissionSettings(max_queue_tokens=15, margin_ms=1.0, refuse_early=False)
    queue = queue_of(*(FakeJob(0.001, samples=8) for _ in range(3)))
    assert precheck(queue, IDLE, model(), 0.001, 0.0, no_refusal, Lateness()) is None
    assert isinstance(admit([FakeJob(0.001, tokens=1)], DeadlineQueue(), IDLE, model(), 0.0, no_refusal, Lateness()),
                      Prediction)
    assert admit([FakeJob(0.001)], queue, IDLE, model(), 0.0, no_refusal, Lateness()).reason == "queue_full"
    plan = dispatch(queue_of(FakeJob(0.001)), "score", SCORE, model(), 0.0, 60.0, 0.0, drop_late=False)
    assert isinstance(plan, Send) and len(plan.live) == 1 and not plan.late


def test_an_arrival_order_queue_serves_first_come_first_and_expires_by_deadline():
    first, second, third = FakeJob(3.0), FakeJob(1.0), FakeJob(2.0)
    queue = DeadlineQueue(QueueOrder.ARRIVAL)
    for job in (first, second, third):
        queue.push(job)
    assert list(queue.in_order()) == [first, second, third]
    assert queue.earliest() is second and queue.earliest_deadline() == 1.0
    assert take_expired(queue, now_s=2.0) == [second, third]
    assert list(queue.in_order()) == [first] and queue.jobs == 1 and queue.remove(first) and not queue


def test_a_batch_takes_jobs_in_deadline_order_up_to_the_bounds():
    jobs = [FakeJob(1.0, samples=3), FakeJob(2.0, samples=6), FakeJob(3.0, samples=5), FakeJob(4.0, samples=1)]
    taken, doomed = form_batch(queue_of(*jobs), "score", SCORE)
    assert taken == [jobs[0], jobs[2]] and not doomed  # 6 does not fit beside 3; 5 does; then 8 samples
    tokens = [FakeJob(1.0, tokens=60), FakeJob(2.0, tokens=60), FakeJob(3.0, tokens=30)]
    assert form_batch(queue_of(*tokens), "score", SCORE)[0] == [tokens[0], tokens[2]]
    labels = [FakeJob(1.0, label_ids=(1, 2)), FakeJob(2.0, label_ids=(3,)), FakeJob(3.0, label_ids=(2,))]
    assert form_batch(queue_of(*labels), "score", SCORE)[0] == [labels[0], labels[2]]


def test_beam_batches_share_one_key_and_the_scan_stops_after_scan_limit_misfits():
    beams = BatchBounds(max_items_per_batch=4, max_tokens_per_batch=None, max_labels=0)
    first = FakeJob(0.5, beam_key=(4, 2, 1))
    others = [FakeJob(1.0 + i, beam_key=(8, 2, 1)) for i in range(SCAN_LIMIT)]
    last = FakeJob(99.0, beam_key=(4, 2, 1))
    taken, _ = form_batch(queue_of(first, *others, last), "beam", beams)
    assert taken == [first]                            # the matching job past SCAN_LIMIT misfits is not seen
    taken, _ = form_batch(queue_of(first, *others[:2], last), "beam", beams)
    assert taken == [first, last]


def test_a_batch_holds_while_its_worker_is_busy_longer_than_the_lead_time():
    queue = queue_of(FakeJob(1.0, samples=2))
    assert dispatch(queue, "score", SCORE, model(), worker_busy_ms=10.0, lead_ms=2.0, now_s=0.0) == Hold(8.0)
    plan = dispatch(queue, "score", SCORE, model(), worker_busy_ms=1.5, lead_ms=2.0, now_s=0.0)
    assert isinstance(plan, Send) and plan.predicted_ms == pytest.approx(4.0)
    full = queue_of(FakeJob(1.0, samples=8))          # full or not: in the worker's FIFO nothing could pass it
    assert dispatch(full, "score", SCORE, model(), 10.0, 2.0, 0.0) == Hold(8.0)


def test_the_lead_time_grows_by_the_loop_s_present_lag_and_shrinks_back_as_it_passes():
    """A loop running 6 ms late fires the hold's timer 6 ms late: the batch is sent that much earlier."""
    late = Lateness(lag_half_life_ms=50.0)
    assert late.lead_ms(2.0, 1.000) == 2.0                       # an on-time loop: the configured wait alone
    late.lag.sample(1.000, 6.0)
    assert late.lead_ms(2.0, 1.000) == pytest.approx(8.0)
    assert late.lead_ms(2.0, 1.050) == pytest.approx(5.0)        # the lag halved 50 ms on
    queue = queue_of(FakeJob(1.0, samples=2))
    assert dispatch(queue, "score", SCORE, model(), 10.0, late.lead_ms(2.0, 1.000), 1.000) == Hold(pytest.approx(2.0))
    assert isinstance(dispatch(queue, "score", SCORE, model(), 7.5, late.lead_ms(2.0, 1.000), 1.000), Send)
    assert dispatch(queue, "score", SCORE, model(), 7.5, 2.0, 1.000) == Hold(5.5)  # without the lag: held


def test_a_job_that_cannot_finish_even_alone_is_dropped_only_by_a_confirmed_model():
    queue = queue_of(FakeJob(0.004), FakeJob(0.020))
    plan = dispatch(queue, "score", SCORE, model(), worker_busy_ms=2.0, lead_ms=5.0, now_s=0.0)
    # 2 ms in flight + 3 ms alone: 5 ms, past the first deadline (4 ms): dropped, nothing sent yet
    assert isinstance(plan, Send) and [j.deadline for j in plan.late] == [0.004] and not plan.live
    trusting = dispatch(queue, "score", SCORE, model(verified=False), 2.0, 5.0, 0.0)
    assert not trusting.late and len(trusting.live) == 2


def test_a_tight_deadline_goes_in_a_short_batch_when_its_companions_would_make_it_late():
    tight, big = FakeJob(0.012, samples=1), FakeJob(0.100, samples=7)    # 1 + 7 samples: 2 + 8 ms together
    slow = model(ms_per_item=1.0, fixed_ms=2.0)
    plan = dispatch(queue_of(tight, big), "score", SCORE, slow, worker_busy_ms=4.0, lead_ms=5.0, now_s=0.0)
    # together: 4 + 10 = 14 ms, past 12; alone: 4 + 3 = 7 ms, then the big one by 4 + 3 + 9 = 16 ms
    assert isinstance(plan, Send) and plan.live == [tight] and not plan.late
    assert plan.finish_at == pytest.approx(0.007)


def test_a_large_fixed_cost_packs_the_batch_and_drops_the_member_it_makes_late():
    head = FakeJob(0.022, samples=1)
    rest = [FakeJob(0.030 + 0.001 * i, samples=1) for i in range(7)]
    costly = model(ms_per_item=1.0, fixed_ms=15.0)     # 15 ms a call: two calls cost more than one head
    plan = dispatch(queue_of(head, *rest), "score", SCORE, costly, worker_busy_ms=0.0, lead_ms=5.0, now_s=0.0)
    # packed: 8 samples in 23 ms, head late (22 ms), 7 in time; short: the head alone (16 ms), then
    # the 7 others by 16 + 22 = 38 ms, past every deadline: 1 answered in 38 ms against 7 in 23 ms
    assert isinstance(plan, Send) and plan.late == [head] and plan.live == rest


def test_expiry_takes_exactly_the_jobs_whose_deadline_passed():
    jobs = [FakeJob(1.0), FakeJob(2.0), FakeJob(2.0), FakeJob(3.0)]
    queue = queue_of(*jobs)
    assert take_expired(queue, now_s=0.5) == []
    assert take_expired(queue, now_s=2.0) == jobs[:3]
    assert list(queue.in_order()) == [jobs[3]] and queue.jobs == 1


def test_busy_ms_counts_work_in_flight_from_the_first_send_or_the_last_answer():
    assert busy_ms([], 5.0) == 0.0
    assert busy_ms([(1.0, 10.0, 0.0), (1.002, 5.0, 0.0)], now_s=1.004) == pytest.approx(11.0)
    assert busy_ms([(1.0, 10.0, 0.0)], now_s=2.0) == 0.0
    # sent at 1.000 while the worker still computed the batch answered at 1.006: it started then
    assert busy_ms([(1.0, 10.0, 0.0)], now_s=1.008, free_since=1.006) == pytest.approx(8.0)


def test_busy_ms_counts_a_batch_overhead_once_when_batches_are_pipelined():
    # two batches of 20 ms compute whose round trips take 4 ms more (2 ms each way), sent at 0 and 1 ms:
    # the first starts at 2 ms and ends at 22, the second starts then and ends at 42; a batch sent at
    # 10 ms arrives at 12 and waits 30 ms (summing round trips, 24 + 24 - 10 = 38, would hold it 8 ms
    # past the moment the worker goes idle)
    assert busy_ms([(0.0, 24.0, 4.0), (0.001, 24.0, 4.0)], now_s=0.010) == pytest.approx(30.0)
    # the first answer came at 24 ms: its batch ended at 22, and the second, there since 3 ms, started
    assert busy_ms([(0.001, 24.0, 4.0)], now_s=0.024, free_since=0.024) == pytest.approx(16.0)
    # alone on an idle worker: it waits for nothing once the batch before it ended
    assert busy_ms([(0.0, 24.0, 4.0)], now_s=0.021) == pytest.approx(0.0)


def test_chunks_fit_one_batch_each_and_keep_every_sample():
    assert chunk_bounds([10] * 20, max_samples_per_batch=8, max_tokens_per_batch=100) == [(0, 8), (8, 16), (16, 20)]
    assert chunk_bounds([60, 60, 30, 200, 5], 8, 100) == [(0, 1), (1, 3), (3, 4), (4, 5)]
    assert chunk_bounds([], 8, 100) == []


def test_every_drop_reason_has_a_code():
    from shared.policy import DropReason

    assert set(DROP_CODES) == set(DropReason)  # every reason answered, none answered twice over
    assert set(DROP_CODES.values()) == {"queue_full", "deadline_unmeetable", "deadline_exceeded", "worker_lost"}
    assert {"expired_in_queue", "predicted_late", "expired_in_worker", "worker_overdue"} <= set(DROP_CODES)


def test_a_learnt_lateness_that_refuses_everything_is_measured_again_by_a_probe():
    late = Lateness()
    for _ in range(400):                                  # requests due in 50 ms came 90 ms late
        late.observe(Prediction(0, 3.0, 50.0, finish_at=1.0), finished_at=1.090)
    job = FakeJob(0.050)                                  # 3 ms alone, due in 50 ms: in time but for the slack
    busy = PoolView(ready_workers=1, soonest_free_ms=0.0, batches_in_flight=1)
    assert isinstance(admit([job], DeadlineQueue(), busy, model(), 0.0, SETTINGS, late), Refusal)
    assert isinstance(admit([job], DeadlineQueue(), IDLE, model(), 0.0, SETTINGS, late), Prediction)
    assert precheck(DeadlineQueue(), IDLE, model(), 0.050, 0.0, SETTINGS, late, items=1) is None
    hopeless = FakeJob(0.002)                             # not even its raw prediction fits: no probe
    assert isinstance(admit([hopeless], DeadlineQueue(), IDLE, model(), 0.0, SETTINGS, late), Refusal)


def test_an_idle_worker_gets_a_job_its_raw_prediction_finishes_whatever_the_learnt_slack():
    queue = queue_of(FakeJob(0.050))                      # 3 ms alone, due in 50 ms; a slack that drops all
    busy = dispatch(queue, "score", SCORE, model(), 1.0, 2.0, 0.0, slack_ms=90.0)
    assert isinstance(busy, Send) and busy.late and not busy.live     # a busy worker: dropped
    idle = dispatch(queue_of(FakeJob(0.050)), "score", SCORE, model(), 0.0, 2.0, 0.0, slack_ms=90.0)
    assert isinstance(idle, Send) and len(idle.live) == 1 and not idle.late


# -- shed_by_cost: under overload, the costliest per answer goes first ------------------------------
BY_COST = AdmissionSettings(max_queue_tokens=1000, margin_ms=0.0, shed_by_cost=True)
BY_DEADLINE = AdmissionSettings(max_queue_tokens=1000, margin_ms=0.0)


def test_shedding_by_cost_keeps_more_jobs_in_time_than_skipping_the_late_ones():
    # 1 ms per item, no fixed cost: a 6-sample job due at 6 ms, then three 1-sample jobs due at 6.5 ms.
    # Deadline order keeps the big one and misses all three behind it; shedding it keeps the three.
    big, *small = FakeJob(0.006, samples=6), FakeJob(0.0065), FakeJob(0.0065), FakeJob(0.0065)
    queue = queue_of(big, *small)
    assert shed_costliest(queue.in_order(), model(1.0, 0.0), 0.0, 1, 0.0) == {id(big)}
    assert place(queue, IDLE, model(1.0, 0.0), 0.0, 0.0, 0.0065) == 6.0  # deadline order: only the big one fits
    before = dispatch(queue, "score", SCORE, model(1.0, 0.0), 0.0, 2.0, 0.0)
    assert isinstance(before, Send) and before.live == [big]  # off: the three are dropped after it
    plan = dispatch(queue, "score", SCORE, model(1.0, 0.0), 0.0, 2.0, 0.0, shed_by_cost=True)
    assert isinstance(plan, Send) and plan.late == [big] and not plan.live  # dropped before compute
    queue.remove(big)
    plan = dispatch(queue, "score", SCORE, model(1.0, 0.0), 0.0, 2.0, 0.0, shed_by_cost=True)
    assert isinstance(plan, Send) and plan.live == small and not plan.late


def test_a_cheap_request_gets_in_by_shedding_a_costlier_one_and_a_costly_one_is_refused():
    big = FakeJob(0.006, samples=6)
    assert isinstance(admit([FakeJob(0.0065)], queue_of(big), IDLE, model(1.0, 0.0), 0.0, BY_DEADLINE, Lateness()),
                      Refusal)  # off: it would finish at 7 ms behind the big one
    assert isinstance(admit([FakeJob(0.0065)], queue_of(big), IDLE, model(1.0, 0.0), 0.0, BY_COST, Lateness()),
                      Prediction)
    two_small = queue_of(FakeJob(0.0065), FakeJob(0.0065))
    # the big one runs first in deadline order and is in time itself, but would push both past 6.5 ms
    assert isinstance(admit([big], two_small, IDLE, model(1.0, 0.0), 0.0, BY_DEADLINE, Lateness()), Prediction)
    refusal = admit([big], two_small, IDLE, model(1.0, 0.0), 0.0, BY_COST, Lateness())
    assert isinstance(refusal, Refusal) and refusal.reason == "deadline_unmeetable"
    assert "costs the most" in refusal.message


def test_shedding_by_cost_changes_nothing_while_every_job_is_in_time():
    jobs = [FakeJob(0.030 + 0.001 * k, samples=1 + k % 3, tokens=5 + 7 * k) for k in range(6)]  # 16 ms of work
    queue = queue_of(*jobs)
    assert shed_costliest(queue.in_order(), model(), 0.0, 1, 0.0) == set()
    for settings in (BY_COST, BY_DEADLINE):
        new = [FakeJob(0.050, samples=2)]
        assert isinstance(admit(new, queue, IDLE, model(), 0.0, settings, Lateness()), Prediction)
        assert precheck(queue, IDLE, model(), 0.050, 0.0, settings, Lateness(), items=2) is None
    on, off = (dispatch(queue, "score", SCORE, model(), 0.0, 2.0, 0.0, shed_by_cost=flag) for flag in (True, False))
    assert isinstance(on, Send) and (on.live, on.late, on.predicted_ms) == (off.live, off.late, off.predicted_ms)


def test_shedding_by_cost_breaks_ties_as_deadline_order_and_never_sheds_for_a_doomed_job():
    same = [FakeJob(0.0030 + 0.0001 * k, samples=1) for k in range(4)]  # equal costs, 1 ms each: the 4th is late
    assert shed_costliest(same, model(1.0, 0.0), 0.0, 1, 0.0) == {id(same[3])}
    big, doomed = FakeJob(0.010, samples=6), FakeJob(0.0005)  # late even alone: it sheds only itself
    assert shed_costliest([big, doomed], model(1.0, 0.0), 0.0, 1, 0.0) == {id(doomed)}


def test_the_precheck_by_cost_refuses_what_the_queue_would_shed_even_at_its_least():
    two_small = queue_of(FakeJob(0.0065), FakeJob(0.0065))
    # 6 samples of one token each still cost 6 ms, more than either queued job: shed, refused untokenized
    refusal = precheck(two_small, IDLE, model(1.0, 0.0), 0.006, 0.0, BY_COST, Lateness(), items=6)
    assert isinstance(refusal, Refusal) and "at the least its 6 item(s) can take" in refusal.message
    assert precheck(two_small, IDLE, model(1.0, 0.0), 0.006, 0.0, BY_COST, Lateness(), items=1) is None
    assert precheck(queue_of(FakeJob(0.006, samples=6)), IDLE, model(1.0, 0.0), 0.0065, 0.0, BY_COST, Lateness(),
                    items=1) is None  # it gets in by shedding the costlier job ahead; deadline order refuses it
    assert isinstance(precheck(queue_of(FakeJob(0.006, samples=6)), IDLE, model(1.0, 0.0), 0.0065, 0.0, BY_DEADLINE,
                               Lateness(), items=1), Refusal)


def test_a_newcomer_hardly_cheaper_than_a_queued_job_is_refused_instead_of_displacing_it():
    # 1 ms per item: a queued job of 40 samples (40 ms) due at 40 ms, a newcomer of 39 (39 ms) due at
    # 41 ms. Only one fits; 40 ms is not more than ADMIT_SHED_GAIN x 39 ms: the queued job keeps its place.
    queued = FakeJob(0.040, samples=40)
    newcomer = [FakeJob(0.041, samples=39)]
    assert 40.0 <= ADMIT_SHED_GAIN * 39.0
    refusal = admit(newcomer, queue_of(queued), IDLE, model(1.0, 0.0), 0.0, BY_COST, Lateness())
    assert isinstance(refusal, Refusal) and refusal.reason == "deadline_unmeetable"
    assert precheck(queue_of(queued), IDLE, model(1.0, 0.0), 0.041, 0.0, BY_COST, Lateness(), items=39) is not None
    # among admitted work the batcher still sheds the costlier one (gain 1): it was admitted first
    assert shed_costliest([queued, *newcomer], model(1.0, 0.0), 0.0, 1, 0.0) == {id(queued)}
    # a newcomer that costs markedly less gets in by shedding it (the batcher drops it before compute)
    cheap = [FakeJob(0.041, samples=20)]
    prediction = admit(cheap, queue_of(queued), IDLE, model(1.0, 0.0), 0.0, BY_COST, Lateness())
    assert isinstance(prediction, Prediction) and prediction.wait_ms + prediction.service_ms == 20.0


class CountingQueue(DeadlineQueue):
    """A queue that counts the passes over its jobs."""

    passes = 0

    def in_order(self):
        self.passes += 1
        return super().in_order()

    def ahead_of(self, deadline, priority=0):
        self.passes += 1
        return super().ahead_of(deadline, priority)

    def in_order_with(self, jobs, deadline, priority=0):
        self.passes += 1
        return super().in_order_with(jobs, deadline, priority)


@pytest.mark.parametrize("settings", [BY_COST, BY_DEADLINE], ids=["by_cost", "by_deadline"])
def test_precheck_and_admit_each_read_the_queue_in_one_pass(settings):
    queue = CountingQueue()
    for k in range(12):  # 1 ms each, due at 10.0-11.1 ms: the last two cannot be in time
        queue.push(FakeJob(0.010 + 0.0001 * k, samples=1))
    new = [FakeJob(0.0105, samples=1)]  # served seventh: done at 7 ms
    queue.passes = 0
    assert precheck(queue, IDLE, model(1.0, 0.0), 0.0105, 0.0, settings, Lateness(), items=1) is None
    assert queue.passes == 1
    queue.passes = 0
    decision = admit(new, queue, IDLE, model(1.0, 0.0), 0.0, settings, Lateness())
    assert isinstance(decision, Prediction) and decision.wait_ms + decision.service_ms == 7.0
    assert queue.passes == 1
