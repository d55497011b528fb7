"""Char-level tokenizer for the bundled model, saved as a standard ``tokenizer.json``.

Every character of the alphabet is one token; ``<bos>`` is prepended on encode (as Llama does), and
``<eos>`` ends a completion. Decoding concatenates characters, so ``decode(encode(s)) == s``.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def build_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    """A fast tokenizer whose vocabulary is the special tokens followed by `alphabet`'s characters."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + sorted(set(alphabet)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
