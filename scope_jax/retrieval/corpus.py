"""Passage corpora: JSONL as {id, title, text} or the Search-R1 form {id, contents: '"Title"\\ntext'}."""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable, Iterator

from etils import epath


@dataclasses.dataclass(frozen=True)
class Passage:
  id: str
  title: str
  text: str

  @property
  def contents(self) -> str:
    """The Search-R1 `contents` field: the quoted title on the first line, then the text."""
    return f'"{self.title}"\n{self.text}'


def passage_from_record(record: dict, line: int | None = None) -> Passage:
  """Parses one JSON record in either corpus format; errors name the line."""
  where = f" (line {line})" if line is not None else ""
  if not isinstance(record, dict):
    raise ValueError(f"Corpus record{where} is not a JSON object.")
  pid = str(record.get("id", line if line is not None else ""))
  if "contents" in record:
    title, _, text = str(record["contents"]).partition("\n")
    return Passage(pid, title.strip().strip('"'), text.strip())
  if "text" in record:
    return Passage(pid, str(record.get("title", "")).strip(), str(record["text"]).strip())
  raise ValueError(f"Corpus record{where} needs 'contents' (Search-R1) or 'text' (with 'title'); "
                   f"found keys {sorted(record)[:6]}.")


def iter_corpus(path) -> Iterator[Passage]:
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"Corpus file {path} does not exist.")
  with path.open() as f:
    for i, line in enumerate(f, 1):
      if line.strip():
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"Corpus {path} line {i} is not valid JSON: {e}.") from None
        yield passage_from_record(record, i)


def load_corpus(path) -> list[Passage]:
  """All passages of a JSONL corpus; an empty corpus is an error."""
  passages = list(iter_corpus(path))
  if not passages:
    raise ValueError(f"Corpus {path} is empty: it needs at least one JSON line with 'text' or "
                     "'contents'.")
  return passages


def write_corpus(passages: Iterable[Passage], path) -> None:
  with epath.Path(path).open("w") as f:
    for p in passages:
      f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")


def format_passages(passages: Iterable[Passage]) -> str:
  """Search-R1 observation text: 'Doc i(Title: T) text' per line."""
  return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1))
