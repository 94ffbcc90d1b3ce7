"""gateway/trace_context.py: a caller's traceparent read per the W3C rules, and the parent-based ratio
sampler deciding as the OpenTelemetry SDK's ParentBased(TraceIdRatioBased) does on the same trace ids."""

from __future__ import annotations

import random

import pytest
from multidict import CIMultiDict
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from gateway.trace_context import CallerContext, RatioSampler, caller_context, traceparent

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def test_a_callers_traceparent_names_its_trace_span_and_sampled_flag():
    headers = CIMultiDict({"TraceParent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=1"})
    assert caller_context(headers) == CallerContext(int(TRACE, 16), int(SPAN, 16), True, "vendor=1")
    assert caller_context(CIMultiDict({"traceparent": f"00-{TRACE}-{SPAN}-00"})).sampled is False
    assert traceparent(int(TRACE, 16), int(SPAN, 16)) == f"00-{TRACE}-{SPAN}-01"


@pytest.mark.parametrize("value", [
    "", "00", f"00-{TRACE}-{SPAN}", f"00-{TRACE.upper()}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01",
    f"00-{TRACE}-{'0' * 16}-01", f"ff-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01-extra", f"00-{TRACE[:-1]}-{SPAN}-01",
    f"0g-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-1",
])
def test_a_malformed_traceparent_is_ignored(value):
    assert caller_context(CIMultiDict({"traceparent": value})) is None


def test_a_later_version_may_carry_more_fields():
    assert caller_context(CIMultiDict({"traceparent": f"01-{TRACE}-{SPAN}-01-later"})).trace_id == int(TRACE, 16)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_new_traces_are_sampled_as_the_sdks_trace_id_ratio_sampler_samples_them(ratio):
    ours, theirs = RatioSampler(ratio), ParentBased(TraceIdRatioBased(ratio))
    ids = [random.Random(k).getrandbits(128) for k in range(2000)]
    decisions = [ours.sampled(trace_id, None) for trace_id in ids]
    assert decisions == [theirs.should_sample(None, trace_id, "x").decision.is_sampled() for trace_id in ids]
    assert abs(sum(decisions) / len(ids) - ratio) < 0.05


@pytest.mark.parametrize("flags", [TraceFlags.DEFAULT, TraceFlags.SAMPLED])
def test_a_callers_sampled_flag_decides_whatever_the_ratio(flags):
    caller = CallerContext(int(TRACE, 16), int(SPAN, 16), flags == TraceFlags.SAMPLED)
    parent = set_span_in_context(NonRecordingSpan(SpanContext(caller.trace_id, caller.span_id, True,
                                                              TraceFlags(flags))))
    for ratio in (0.0, 1.0):
        sdk = ParentBased(TraceIdRatioBased(ratio)).should_sample(parent, caller.trace_id, "x").decision.is_sampled()
        assert RatioSampler(ratio).sampled(caller.trace_id, caller) == sdk == caller.sampled


def test_a_ratio_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="must be in"):
        RatioSampler(1.5)
