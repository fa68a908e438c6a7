"""Corpus formats, index build/save/load, real retrieval quality, and the HTTP service."""

import json
import socket
import threading

import chex
import numpy as np
import pytest
import requests

from scope_jax.retrieval import DenseIndex, RetrievalClient, SearchTool, make_server
from scope_jax.retrieval.corpus import Passage, load_corpus, passage_from_record
from scope_jax.retrieval.realdata import recall_at_k, retrieval_benchmark


def test_corpus_formats(tmp_path):
  f = tmp_path / "c.jsonl"
  f.write_text('{"id": "1", "title": "Ankara", "text": "Capital of Turkey."}\n\n'
               '{"id": "2", "contents": "\\"Paris\\"\\nCapital of France."}\n')
  a, b = load_corpus(f)
  assert a == Passage("1", "Ankara", "Capital of Turkey.")
  assert b == Passage("2", "Paris", "Capital of France.") and b.contents == '"Paris"\nCapital of France.'
  with pytest.raises(ValueError, match="needs 'contents'"):
    passage_from_record({"id": 1, "body": "x"}, 3)
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(ValueError, match="is empty"):
    load_corpus(tmp_path / "empty.jsonl")
  with pytest.raises(FileNotFoundError):
    load_corpus(tmp_path / "missing.jsonl")


def _recall(minilm, num_passages, max_questions, kind="flat", out=None):
  passages, pairs = retrieval_benchmark(num_passages, max_questions)
  index = DenseIndex.build(passages, minilm, out, kind=kind, chunk_size=256, progress=False)
  tool = SearchTool(index, minilm, topk=10)
  hits = tool.retrieve([q for q, _ in pairs], 10)
  ids = [[p.id for p, _ in row] for row in hits]
  gold = [g for _, g in pairs]
  return recall_at_k(ids, gold, 1), recall_at_k(ids, gold, 10), index


def test_retrieval_quality_small(minilm, tmp_path):
  r1, r10, index = _recall(minilm, 400, 120, out=tmp_path / "idx")
  print(f"MiniLM over 400 wiki leads, 120 FanOutQA sub-questions: R@1 {r1:.3f}, R@10 {r10:.3f}")
  assert r10 >= 0.95
  # save/load round trip gives identical search results
  loaded = DenseIndex.load(tmp_path / "idx", minilm.identity)
  q = minilm.encode(["capital of Turkey"], "query")
  chex.assert_trees_all_equal(index.search(q, 5)[1], loaded.search(q, 5)[1])
  assert loaded.passages == index.passages
  # resumable: a second build reuses the embedding chunks (and gives the same index)
  again = DenseIndex.build(index.passages, minilm, tmp_path / "idx", chunk_size=256, progress=False)
  chex.assert_trees_all_equal(again.search(q, 5)[1], index.search(q, 5)[1])


@pytest.mark.slow
def test_retrieval_quality_full(minilm):
  r1, r10, _ = _recall(minilm, 2000, None)
  print(f"MiniLM over 2000 wiki leads, 558 FanOutQA sub-questions: R@1 {r1:.3f}, R@10 {r10:.3f}")
  assert r10 >= 0.95


def test_mismatched_encoder_is_refused(minilm, tmp_path):
  passages = [Passage(str(i), f"T{i}", f"text number {i}") for i in range(5)]
  DenseIndex.build(passages, minilm, tmp_path, progress=False)
  other = dict(minilm.identity, weights_sha256="0" * 64, name="e5-base-v2")
  with pytest.raises(ValueError, match="built with a different encoder.*Rebuild the index"):
    DenseIndex.load(tmp_path, other)
  with pytest.raises(FileNotFoundError, match="No index at"):
    DenseIndex.load(tmp_path / "nope")


@pytest.fixture()
def server(minilm):
  passages = [Passage("a", "Ankara", "Ankara is the capital of Turkey."),
              Passage("p", "Paris", "Paris is the capital of France."),
              Passage("b", "Berlin", "Berlin is the capital of Germany.")]
  tool = SearchTool(DenseIndex.build(passages, minilm, progress=False), minilm)
  srv = make_server(tool, port=0)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{srv.server_address[1]}", srv
  srv.shutdown()


def test_http_service_speaks_search_r1(server):
  url, srv = server
  assert srv.server_address[0] == "127.0.0.1"  # loopback by default
  body = {"queries": ["What is the capital of France?", "Turkey capital"], "topk": 2,
          "return_scores": True}
  resp = requests.post(url + "/retrieve", json=body, timeout=30)
  assert resp.status_code == 200
  result = resp.json()["result"]
  assert len(result) == 2 and len(result[0]) == 2
  top = result[0][0]
  assert set(top) == {"document", "score"} and set(top["document"]) == {"id", "contents"}
  assert top["document"] == {"id": "p", "contents": '"Paris"\nParis is the capital of France.'}
  assert result[1][0]["document"]["id"] == "a" and isinstance(top["score"], float)
  plain = requests.post(url + "/retrieve", json={**body, "return_scores": False}, timeout=30).json()
  assert plain["result"][0][0] == top["document"]
  # the client and its tool interface
  client = RetrievalClient(url, retries=0)
  assert client(["capital of Germany"])[0].startswith("Doc 1(Title: Berlin) Berlin is")


@pytest.mark.parametrize("payload,status,message", [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"queries": "x"}).encode(), 400, "list of strings"),
    (json.dumps({"queries": ["x"], "topk": 1000}).encode(), 400, "'topk' must be"),
    (json.dumps({"queries": ["x"] * 600}).encode(), 413, "at most 512 queries"),
    (b"[" + b" " * (2 << 20) + b"]", 413, "body over"),
    (b'{"queries": ["\\ud800 lone surrogate"]}', 400, "valid Unicode"),
    (json.dumps({"queries": ["x" * 2000] * 100, "topk": 50}).encode(), 413, "too much work"),
])
def test_http_service_rejects_bad_requests(server, payload, status, message):
  url, _ = server
  resp = requests.post(url + "/retrieve", data=payload, timeout=30,
                       headers={"Content-Type": "application/json"})
  assert resp.status_code == status and message in resp.json()["error"]


def test_client_retries_then_fails_clearly():
  client = RetrievalClient("http://127.0.0.1:9", retries=1, backoff=0.01, timeout=1)
  with pytest.raises(ConnectionError, match="failed after 2 attempts"):
    client.retrieve(["q"])


class _FakeEncoder:
  """Deterministic random unit vectors per text (for index-kind tests without a model)."""

  dim = 16
  identity = {"name": "fake", "weights_sha256": "x", "query_prefix": "", "passage_prefix": "",
              "pooling": "mean", "normalize": True, "dim": 16}

  def encode(self, texts, kind="passage"):
    out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=16) for t in texts])
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_index_kinds_find_exact_duplicates(kind, tmp_path):
  passages = [Passage(str(i), f"T{i}", f"passage text {i}") for i in range(300)]
  enc = _FakeEncoder()
  index = DenseIndex.build(passages, enc, tmp_path / kind, kind=kind, nlist=8, progress=False)
  loaded = DenseIndex.load(tmp_path / kind, enc.identity)
  q = enc.encode([f"T{i}. passage text {i}" for i in (3, 150, 299)])
  _, ids = loaded.search(q, 1)
  assert ids[:, 0].tolist() == [3, 150, 299] and loaded.kind == kind


def _read_reply(sock: socket.socket) -> str:
  """The whole reply: the server closes the connection after it (headers and body may arrive
  in separate packets, so one recv is not enough)."""
  chunks = []
  while chunk := sock.recv(65536):
    chunks.append(chunk)
  return b"".join(chunks).decode()


@pytest.mark.parametrize("length,status,message", [
    ("-5", 400, "negative"), ("abc", 400, "not an integer"), (str(2 << 20), 413, "body over")])
def test_http_service_checks_content_length(server, length, status, message):
  url, _ = server
  host, port = url.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=30) as sock:
    sock.sendall(f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}"
                 .encode())
    reply = _read_reply(sock)
  assert f" {status} " in reply.splitlines()[0] and message in reply


def test_http_service_drops_a_short_body_after_its_timeout(server, monkeypatch):
  from scope_jax.retrieval import service
  url, srv = server
  srv.RequestHandlerClass.timeout = 0.5
  host, port = url.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=30) as sock:
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    reply = _read_reply(sock)
  assert " 408 " in reply.splitlines()[0]
  srv.RequestHandlerClass.timeout = service.SOCKET_TIMEOUT_S
