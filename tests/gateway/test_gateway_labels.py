"""Labels to token ids (gateway/tokenizer.py): two labels that the tokenizer makes one token are refused,
naming both, before any batch is formed (a worker refuses a request whose label ids repeat)."""

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from gateway.errors import ApiError
from gateway.tokenizer import RequestTokenizer


def lowercasing() -> RequestTokenizer:
    """A word-level tokenizer that lowercases its input, as many checkpoints' normalizers do."""
    tokenizer = Tokenizer(models.WordLevel({"yes": 0, "no": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return RequestTokenizer(tokenizer)


def test_labels_that_become_one_token_are_refused_naming_both():
    tokenizer = lowercasing()
    assert tokenizer.label_ids(["yes", "NO"]) == [0, 1]
    with pytest.raises(ApiError) as refused:
        tokenizer.label_ids(["yes", "no", "YES"])
    assert refused.value.code == "invalid_request"
    assert refused.value.message == ("labels[2] = 'YES' is the same token (0) as labels[0] = 'yes'; give each "
                                     "label once")
