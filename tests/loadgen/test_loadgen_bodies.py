"""Bodies of exact token lengths: input_ids mode and text mode with a real (small, trained) tokenizer."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loadgen.bodies import BodyFactory, BodyOptions, TextSynthesizer
from loadgen.trace import TraceRecord

WORDS = ("river mountain city ocean forest market garden window bridge silver rocket planet "
         "yellow orange purple simple quick brown lazy happy search query result model token").split()


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(300)]
    tokenizer.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_ids_mode_hits_lengths_exactly_without_a_tokenizer():
    factory = BodyFactory(BodyOptions(label_token_ids=(5, 6), output="probs", top_k=3, deadline_ms=40))
    body = factory.body(TraceRecord(t_ms=0, route="score", sample_tokens=(1, 17, 511)), index=0)
    assert [len(s["input_ids"]) for s in body["samples"]] == [1, 17, 511]
    assert all(10 <= i < 1000 for s in body["samples"] for i in s["input_ids"])
    assert body["label_token_ids"] == [5, 6] and body["output"] == "probs" and body["top_k"] == 3
    assert body["deadline_ms"] == 40
    again = factory.body(TraceRecord(t_ms=0, route="score", sample_tokens=(1, 17, 511)), index=0)
    assert again == body


def test_ids_mode_with_tokenizer_avoids_special_tokens(tokenizer_path):
    factory = BodyFactory(BodyOptions(tokenizer_path=tokenizer_path))
    body = factory.body(TraceRecord(t_ms=0, route="generate", prompt_tokens=300), index=4)
    special = {Tokenizer.from_file(tokenizer_path).token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>")}
    assert len(body["input_ids"]) == 300 and not special & set(body["input_ids"])
    assert body["beam_width"] == 16 and body["max_new_tokens"] == 4 and body["num_return_sequences"] == 1


def test_text_mode_builds_text_of_exact_token_counts(tokenizer_path):
    tokenizer = Tokenizer.from_file(tokenizer_path)
    factory = BodyFactory(BodyOptions(mode="text", tokenizer_path=tokenizer_path))
    lengths = (1, 2, 7, 64, 200)
    body = factory.body(TraceRecord(t_ms=0, route="score", sample_tokens=lengths), index=1)
    counts = [len(tokenizer.encode(s, add_special_tokens=False).ids) for s in body["samples"]]
    assert counts == list(lengths)
    prompt = factory.body(TraceRecord(t_ms=0, route="generate", prompt_tokens=33), index=2)["prompt"]
    assert len(tokenizer.encode(prompt, add_special_tokens=False).ids) == 33


def test_text_mode_needs_a_tokenizer_and_a_usable_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer"):
        BodyFactory(BodyOptions(mode="text"))
    bare = Tokenizer(models.WordLevel({"[UNK]": 0, "1": 1, "2": 2}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="use ids mode"):
        TextSynthesizer(bare)


def test_a_body_in_the_trace_is_sent_as_is_plus_deadline():
    record = TraceRecord(t_ms=0, route="score", body={"samples": ["a b"], "labels": ["yes"]}, deadline_ms=25)
    assert BodyFactory().body(record, 0) == {"samples": ["a b"], "labels": ["yes"], "deadline_ms": 25}
