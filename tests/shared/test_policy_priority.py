"""Priorities in the policy: larger is served first and given up last; within a priority, deadlines
order the queue (a fake clock, the policy's pure functions)."""

from __future__ import annotations

from shared.policy import AdmissionSettings, DeadlineQueue, Lateness, Prediction, QueueOrder, Refusal, admit, \
    shed_costliest, take_expired
from tests.shared.test_policy import IDLE, FakeJob, model, queue_of

BY_COST = AdmissionSettings(max_queue_tokens=10_000, margin_ms=1.0, shed_by_cost=True)
BY_DEADLINE = AdmissionSettings(max_queue_tokens=10_000, margin_ms=1.0)


def test_a_larger_priority_is_served_first_and_deadlines_order_each_priority():
    low_soon, low_late = FakeJob(0.010), FakeJob(0.050)
    high_late, high_soon = FakeJob(0.090, priority=2), FakeJob(0.070, priority=2)
    middle = FakeJob(0.001, priority=1)
    queue = queue_of(low_late, high_late, low_soon, middle, high_soon)
    assert list(queue.in_order()) == [high_soon, high_late, middle, low_soon, low_late]
    assert list(queue.ahead_of(0.080, priority=2)) == [high_soon]
    assert list(queue.ahead_of(0.0, priority=1)) == [high_soon, high_late]
    assert list(queue.ahead_of(0.020, priority=0)) == [high_soon, high_late, middle, low_soon]


def test_expiry_follows_deadlines_across_priorities():
    queue = queue_of(FakeJob(0.050, priority=3), soonest := FakeJob(0.010, priority=0), FakeJob(0.030, priority=1))
    assert queue.earliest() is soonest and queue.earliest_deadline() == 0.010
    assert take_expired(queue, 0.020) == [soonest] and len(queue) == 2
    assert [j.deadline for j in take_expired(queue, 1.0)] == [0.030, 0.050] and len(queue) == 0


def test_an_arrival_order_queue_keeps_priorities_first():
    queue = DeadlineQueue(QueueOrder.ARRIVAL)
    first, second, urgent = FakeJob(0.9), FakeJob(0.1), FakeJob(0.5, priority=1)
    for job in (first, second, urgent):
        queue.push(job)
    assert list(queue.in_order()) == [urgent, first, second]


def test_under_overload_a_low_priority_request_is_refused_where_a_high_one_is_admitted():
    # 1 ms an item, 2 ms a batch; eight full batches (80 ms) of priority-1 work due at 90 ms: a request
    # due at 30 ms is served before them at their priority or above, after them below it
    queue = queue_of(*(FakeJob(0.090, samples=8, priority=1) for _ in range(8)))
    for settings in (BY_DEADLINE, BY_COST):
        low = admit([FakeJob(0.030, samples=8)], queue, IDLE, model(), 0.0, settings, Lateness())
        high = admit([FakeJob(0.030, samples=8, priority=1)], queue, IDLE, model(), 0.0, settings, Lateness())
        assert isinstance(low, Refusal) and low.reason == "deadline_unmeetable"
        assert isinstance(high, Prediction) and high.wait_ms + high.service_ms == 10.0  # served first


def test_a_lower_priority_is_shed_before_any_of_a_higher_one_whatever_it_costs():
    # one worker, 1 ms an item: the two can't both finish by 8 ms
    cheap_low = FakeJob(0.008, samples=4)
    costly_high = FakeJob(0.008, samples=5, priority=1)
    shed = shed_costliest([costly_high, cheap_low], model(1.0, 0.0), 0.0, 1, 0.0)
    assert shed == {id(cheap_low)}
    # a walk that meets the low one first (a queue never does): the late high one sheds it, costly or not
    first_low, late_high = FakeJob(0.008, samples=3), FakeJob(0.008, samples=6, priority=1)
    assert shed_costliest([first_low, late_high], model(1.0, 0.0), 0.0, 1, 0.0) == {id(first_low)}
    # a late low-priority job never sheds a high-priority one, however costly
    big_high, small_low = FakeJob(0.009, samples=8, priority=1), FakeJob(0.009, samples=2)
    assert shed_costliest([big_high, small_low], model(1.0, 0.0), 0.0, 1, 0.0) == {id(small_low)}
