"""shared/work.py: one WorkSize answers what a request sends, computes, reuses and how the bounds
and the latency model count it."""

from shared.bounds import ScoreShape
from shared.prefix import prefix_key
from shared.work import HeldPrefixes, StaticPrefix, WorkSize, batch_shape

STATIC = StaticPrefix((7, 8, 9))


def computed(prefix, suffixes, reuse=StaticPrefix()):
    return WorkSize.of([list(prefix) + list(s) for s in suffixes], len(prefix), reuse).computed_tokens


def test_computed_tokens_count_a_shared_prefix_once_and_never_the_reused_static_prefix():
    assert computed([], [[1, 2, 3], [4]]) == 4  # unshared: every token
    assert computed([5, 6, 1], [[2, 3], [], [4]]) == 3 + 3  # the prefix once, then the suffixes
    assert computed([], [[7, 8, 9, 1], [7, 8, 9], [1, 7, 8, 9]], STATIC) == 1 + 3 + 4
    assert computed([7, 8, 9, 5], [[1], [2]], STATIC) == 1 + 2
    assert computed([7, 8, 9], [[1], [2]], STATIC) == 0 + 2  # the prefix is the static part: all reused
    assert computed([7, 8, 9], [[1], []], STATIC) == 3 + 1  # ... unless a sample ends inside it


def test_sent_prompt_and_cached_tokens_and_the_shape_the_bounds_check():
    work = WorkSize.of([[7, 8, 9, 5, 1], [7, 8, 9, 5, 2, 3], [7, 8, 9, 5]], 4, STATIC)
    assert (work.samples, work.prefix_len, work.suffix_lens) == (3, 4, (1, 2, 0))
    assert work.sent_tokens == 4 + 3 and work.prompt_tokens == 5 + 6 + 4
    assert work.reused_tokens == 3 and work.computed_tokens == 4
    assert work.cached_tokens == work.prompt_tokens - work.computed_tokens == 11
    assert work.batch_items == 3 and work.latency_tokens == 4
    assert work.shape(labels=2, top_k=5) == ScoreShape(samples=3, longest_sample=6, prefix_tokens=4, tokens=7,
                                                       labels=2, top_k=5)
    whole = WorkSize.of([[1, 2, 3]])
    assert whole.shape() == ScoreShape(1, 3, 0, 3, 0) and whole.cached_tokens == 0
    assert batch_shape([work, whole], labels=3) == ScoreShape(4, 6, 4, 10, 3)


def test_a_beam_prompt_counts_its_beams_as_items_and_its_prompt_once_per_beam():
    prompt = WorkSize.prompt(12, beams=8)
    assert (prompt.samples, prompt.sent_tokens, prompt.batch_items, prompt.latency_tokens) == (1, 12, 8, 96)


def test_reuse_is_one_notion_any_source_of_cached_rows_can_answer():
    class CachedRows:  # e.g. a cache of recently seen prefixes: the first 6 tokens of anything starting 1, 2
        def reused(self, ids, every_sample_goes_on, shared=True):
            return min(6, len(ids) - (0 if every_sample_goes_on else 1)) if list(ids[:2]) == [1, 2] else 0

    shared = WorkSize.of([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10]], 8, CachedRows())
    assert shared.reused_tokens == 6 and shared.computed_tokens == 8 + 2 - 6
    alone = WorkSize.of([[1, 2, 3], [4, 5]], 0, CachedRows())
    assert alone.reused_tokens == 2 and alone.computed_tokens == 3  # a sample computes at least its last token


def test_a_workers_held_prefixes_leave_the_longest_one_uncomputed():
    context = list(range(100, 140))
    held = HeldPrefixes(frozenset({(prefix_key(context[:25]), 25), (prefix_key(context), 40),
                                   (prefix_key([7] * 30), 30)}), StaticPrefix((100, 101, 102)))
    samples = [context + [1, 2], context + [3]]
    whole = WorkSize.of(samples, 40, held)
    assert whole.reused_tokens == 40 and whole.computed_tokens == 3
    longer = WorkSize.of([context + [9, 1, 2], context + [9, 3]], 41, held)
    assert longer.reused_tokens == 40 and longer.computed_tokens == 1 + 3
    ends_in_it = WorkSize.of([context, context + [5]], 40, held)  # a sample ends in the prefix: its last token computes
    assert ends_in_it.reused_tokens == 25
    other = WorkSize.of([context[:3] + [8] * 10, context[:3] + [8] * 9 + [4]], 12, held)
    assert other.reused_tokens == 3  # the static prefix alone
    unshared = WorkSize.of([context + [1]], 0, held)
    assert unshared.reused_tokens == 3  # cached rows serve shared prefixes; the static one serves all
