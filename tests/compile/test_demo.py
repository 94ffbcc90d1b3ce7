"""The demo generator writes a loadable Qwen3 checkpoint with a locally trained byte-level BPE tokenizer."""

import subprocess
import sys

from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from compile.checkpoint import read_spec
from tests.builds import ROOT


def test_demo_generator_writes_a_usable_checkpoint(tmp_path):
    out = tmp_path / "demo"
    subprocess.run([sys.executable, "-m", "compile.demo", "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    spec = read_spec(out)
    assert spec.family == "qwen3" and spec.head_dim != spec.hidden_size // spec.num_heads
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "best coffee near me ☕"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text  # byte-level: nothing is lost
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == spec.vocab_size == tokenizer.get_vocab_size()
