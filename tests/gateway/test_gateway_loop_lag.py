"""The event loop's lag, sampled into the batchers' present lag (gateway/loop_lag.py)."""

from __future__ import annotations

import asyncio

from gateway.loop_lag import LoopLagWatch
from shared.policy import PresentLag
from tests.gateway.waiting import until


async def test_a_loop_held_busy_is_sampled_as_late_and_a_stopped_watch_samples_no_more():
    loop = asyncio.get_running_loop()
    lags = [PresentLag(half_life_ms=1000.0), PresentLag(half_life_ms=1000.0)]
    watch = LoopLagWatch(lags, tick_s=0.001)
    watch.start()
    held_from = loop.time()
    while loop.time() - held_from < 0.040:  # the loop busy for 40 ms: its next timer fires that late
        pass
    await until(lambda: lags[0].ms(loop.time()) > 0.0, what="a lag sampled")
    assert all(lag.ms(loop.time()) > 30.0 for lag in lags)   # every batcher's lag, each ~39 ms (slow half-life)
    watch.stop()
    before = lags[0].ms(loop.time())
    held_from = loop.time()
    while loop.time() - held_from < 0.080:  # held again, longer: a stopped watch does not see it
        pass
    await asyncio.sleep(0)
    assert lags[0].ms(loop.time()) <= before
