"""The worker's prefix cache (worker/prefix_cache.py): exact lookups, insert rules, eviction by
saving per byte, pinning, and a byte budget that holds under a stream of unique prefixes."""

from __future__ import annotations

import torch

from shared.work import StaticPrefix
from worker.prefix_cache import ID_BYTES, PrefixCache, plan_batch

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 4
ROW_BYTES = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4 + ID_BYTES  # keys + values (fp32) + the kept id, per token


def kv(ids, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys/values [layers, P, Hkv, D] that differ per prefix (a wrong entry would show)."""
    g = torch.Generator().manual_seed(seed + sum(ids))
    shape = (LAYERS, len(ids), KV_HEADS, HEAD_DIM)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def cache(rows: int, **kw) -> PrefixCache:
    return PrefixCache(budget_bytes=rows * ROW_BYTES, build_key=b"build-a", **kw)


def test_a_hit_returns_the_inserted_rows_and_counts_its_tokens():
    c, ids = cache(100), list(range(10, 20))
    keys, values = kv(ids)
    assert c.insert(ids, keys, values)
    hit = c.lookup(ids + [7, 8])  # the request's shared prefix goes on after the cached one
    assert hit is not None and hit.tokens == len(ids)
    assert torch.equal(hit.keys, keys) and torch.equal(hit.values, values)
    assert c.lookup([10, 11, 99]) is None
    assert (c.stats.hits, c.stats.misses, c.stats.hit_tokens) == (1, 1, 10)
    assert c.stats.bytes_held == 10 * ROW_BYTES


def test_the_longest_cached_proper_prefix_answers():
    c = cache(100)
    short, long = [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7]
    c.insert(short, *kv(short))
    c.insert(long, *kv(long))
    assert c.lookup(long + [9]).tokens == 7
    assert c.lookup([1, 2, 3, 4, 5, 6, 8]).tokens == 4  # diverges inside the long entry


def test_another_build_never_sees_the_entries():
    a, ids = cache(100), [5, 6, 7, 8]
    a.insert(ids, *kv(ids))
    b = PrefixCache(budget_bytes=a.budget_bytes, build_key=b"build-b")
    assert a.digest(ids) != b.digest(ids)


class CollidingCache(PrefixCache):
    """Every prefix of one length gets the same digest: a crafted collision."""

    def _digests(self, ids, lengths):
        return {n: b"same" for n in lengths}


def test_a_colliding_digest_never_returns_another_prefixs_rows():
    c = CollidingCache(budget_bytes=100 * ROW_BYTES, build_key=b"x")
    c.insert([1, 2, 3], *kv([1, 2, 3]))
    assert c.lookup([4, 5, 6, 7]) is None  # same digest at length 3, other ids
    assert c.stats.hits == 0 and c.stats.misses == 1


def test_inserted_on_second_sighting_or_when_reuse_is_expected():
    c, ids = cache(100), [3, 1, 4, 1, 5]
    assert not c.wants(ids)
    assert c.wants(ids)
    assert c.wants([9, 9, 9], reuse_expected=True)
    c.insert(ids, *kv(ids))
    assert not c.wants(ids)  # held already


def test_sightings_are_bounded():
    c = cache(100, max_sightings=8)
    for i in range(100):
        c.wants([i, i + 1])
    assert len(c._sightings) == 8
    assert not c.wants([0, 1])  # forgotten: a first sighting again


def test_unique_prefixes_never_grow_memory_past_the_budget():
    c = cache(64)
    for i in range(500):
        ids = [i] * (5 + i % 23)
        assert c.wants(ids, reuse_expected=True)
        c.insert(ids, *kv(ids))
        held = sum(e.keys.nbytes + e.values.nbytes + ID_BYTES * len(e.ids) for e in c._entries.values())
        assert held == c.stats.bytes_held <= c.budget_bytes
    assert c.stats.evictions > 0
    assert c.stats.insertions == 500


def test_eviction_keeps_the_most_saving_per_byte():
    c = cache(30)
    hot, cold, new = [1] * 10, [2] * 10, [3] * 10
    c.insert(hot, *kv(hot))
    c.insert(cold, *kv(cold))
    for _ in range(3):
        c.lookup(hot)
    c.insert(new, *kv(new))
    assert c.stats.evictions == 0  # all three fit
    newer = [4] * 10
    c.insert(newer, *kv(newer))  # one must go: the cold or the new one, never the hot one
    assert c.lookup(hot) is not None
    assert c.stats.evictions == 1


def test_an_entry_not_hit_ages_out_behind_newer_useful_ones():
    c = cache(20)
    old = [1] * 10
    c.insert(old, *kv(old))
    c.lookup(old)
    for i in range(2, 6):  # a stream of entries each hit twice: the clock passes the old entry's priority
        ids = [i] * 10
        c.insert(ids, *kv(ids))
        c.lookup(ids)
        c.lookup(ids)
    assert c.lookup(old) is None


def test_pinned_entries_stay_and_an_entry_too_big_is_refused():
    c = cache(20)
    static = [7] * 8
    assert c.insert(static, *kv(static), pinned=True)
    for i in range(30):
        ids = [i + 100] * 6
        c.insert(ids, *kv(ids))
    assert c.lookup(static + [1]).tokens == 8
    big = [5] * 13  # more than the 12 rows the pinned entry leaves
    assert not c.insert(big, *kv(big))
    assert c.stats.refusals == 1 and c.stats.bytes_held <= c.budget_bytes


def test_off_holds_nothing():
    c = PrefixCache(budget_bytes=0, build_key=b"x")
    ids = [1, 2, 3]
    assert not c.wants(ids, reuse_expected=True)
    assert not c.insert(ids, *kv(ids))
    assert c.lookup(ids) is None and c.stats.bytes_held == 0


def test_rows_must_match_the_ids():
    c, ids = cache(100), [1, 2, 3]
    keys, values = kv([1, 2])
    try:
        c.insert(ids, keys, values)
    except ValueError as exc:
        assert "[layers, 3, kv_heads, head_dim]" in str(exc)
    else:
        raise AssertionError("rows of 2 tokens were accepted for 3 ids")


def test_a_batch_plan_reads_the_longest_useful_hit_and_inserts_what_will_be_reused():
    static = StaticPrefix((1, 2, 3))
    c = cache(1000)
    held = [1, 2, 3, 4, 5, 6, 7, 8]
    c.insert(held, *kv(held))
    only_static = [1, 2, 3]
    c.insert(only_static, *kv(only_static))
    plans = plan_batch(c, [held + [9], held, [1, 2, 3, 9, 9], [], [50, 51, 52]],
                       [True, False, True, True, True], [False, False, False, False, True], static)
    assert [p.hit_tokens for p in plans] == [8, 0, 0, 0, 0]
    # held + [9]: read 8, insert on a second sighting only; held with a sample ending in it: its
    # last token computes, and [1, 2, 3] held is no better than the static rows
    assert [p.insert for p in plans] == [False, False, False, False, True]  # the split request's prefix at once
    again = plan_batch(c, [held + [9]], [True], [False], static)
    assert again[0].hit_tokens == 8 and again[0].insert  # its second sighting
    c.insert(held + [9], *kv(held + [9]))
    whole = plan_batch(c, [held + [9]], [True], [False], static)
    assert whole[0].hit_tokens == 9 and not whole[0].insert


def test_a_split_request_computes_its_prefix_once():
    c, context = cache(1000), list(range(40, 60))
    computed = 0
    for chunk in range(4):  # four batches of one request, one after another
        plan = plan_batch(c, [context], [True], [True], StaticPrefix())[0]
        computed += len(context) - plan.hit_tokens
        if plan.insert:
            c.insert(context, *kv(context))
    assert computed == len(context)
