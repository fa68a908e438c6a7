"""Trains the demo's byte-level BPE tokenizer on the bundled corpus and the prompt templates.

    python tools/build_demo_tokenizer.py

Lossless (byte-level), 2,048 ids including the ChatML specials; it makes the CPU demo's
sequences ~4× shorter than raw bytes. Real runs use their checkpoint's own tokenizer.
"""

import pathlib

from scope_jax import data
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.tokenizer import SPECIALS

OUT = data.DEMO_TOKENIZER
VOCAB = 2048


def main():
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  texts = [f"{p.title}. {p.text}" for p in demo.demo_passages()]
  prompts_dir = pathlib.Path(data.__file__).parent.parent / "prompts"
  texts += [p.read_text(encoding="utf-8") for p in sorted(prompts_dir.rglob("*.txt"))] * 20
  tok.train_from_iterator(texts, trainer)
  tok.save(str(OUT))
  print(f"wrote {OUT} ({tok.get_vocab_size()} ids)")


if __name__ == "__main__":
  main()
