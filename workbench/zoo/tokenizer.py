"""A character-level tokenizer for the embedded models, saved as a transformers tokenizer.

Every printable ASCII character and the newline is one token, so any ASCII prompt (embedded
task or user JSONL) can be encoded, and a token's text is obvious when reading timelines.
``tokenizer(prompt)`` prepends ``<s>``; responses end with ``</s>``.
"""
from __future__ import annotations


from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

__all__ = ["build_char_tokenizer", "SPECIAL_TOKENS", "CHARS"]

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>"}
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer; ``save_pretrained`` it next to a model and ``AutoTokenizer`` loads it."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left",
                                   model_max_length=1024, **SPECIAL_TOKENS)
