"""Which wire ids are chunks of a split request (the worker keeps such a prefix at first sight)."""

import pytest

from shared.request_ids import chunk_id, client_id, is_chunk, wire_id


@pytest.mark.parametrize("caller", ["abc", "a~b", "x#1", "user~3#2", ""])
def test_a_chunk_is_told_from_a_whole_request_whatever_the_callers_id(caller):
    whole = wire_id(caller, 41)
    assert not is_chunk(whole)
    assert is_chunk(chunk_id(whole, 0)) and is_chunk(chunk_id(whole, 12))
    assert client_id(chunk_id(whole, 3)) == caller


@pytest.mark.parametrize("raw", ["plain", "a#1", "a~b#1", "a~1#", "a~#1"])
def test_ids_not_made_by_the_gateway_are_not_chunks(raw):
    assert not is_chunk(raw)
