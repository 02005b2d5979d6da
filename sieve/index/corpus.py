"""Documents and BEIR-format readers (corpus.jsonl, queries.jsonl, qrels/*.tsv)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    @property
    def full_text(self) -> str:
        # BEIR convention: encoders see "title text".
        return f"{self.title} {self.text}".strip()


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line of a JSONL file."""
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); "
                                 "each line must be one JSON object") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, "
                                 f"got {type(obj).__name__}")
            yield lineno, obj


def _id_field(obj: dict[str, Any], path: Path, lineno: int) -> str:
    value = obj.get("_id")
    # Some BEIR dumps store numeric ids; ids are strings everywhere else.
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(f"{path}:{lineno}: missing or invalid '_id' "
                         f"(got {value!r}); a non-empty string or integer is required")
    return str(value)


def _text_field(obj: dict[str, Any], key: str, path: Path, lineno: int) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{path}:{lineno}: field {key!r} must be a string, "
                         f"got {type(value).__name__}")
    return value


def read_beir_corpus(path: str | Path) -> list[Document]:
    """Read corpus.jsonl; 'title' and 'text' are optional, '_id' is required."""
    path = Path(path)
    docs = []
    for lineno, obj in _json_lines(path):
        doc_id = _id_field(obj, path, lineno)
        title = _text_field(obj, "title", path, lineno)
        text = _text_field(obj, "text", path, lineno)
        docs.append(Document(doc_id, title, text))
    return docs


def read_queries(path: str | Path) -> dict[str, str]:
    """Read queries.jsonl into {query id: text}."""
    path = Path(path)
    queries = {}
    for lineno, obj in _json_lines(path):
        queries[_id_field(obj, path, lineno)] = _text_field(obj, "text", path, lineno)
    return queries


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read a qrels TSV (header 'query-id corpus-id score') into {qid: {docid: grade}}."""
    path = Path(path)
    qrels: dict[str, dict[str, int]] = {}
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if lineno == 1 and fields[0] == "query-id":
                continue
            if not line.strip():
                continue
            qid, docid, grade = _qrels_fields(fields, path, lineno)
            qrels.setdefault(qid, {})[docid] = grade
    return qrels


def _qrels_fields(fields: list[str], path: Path, lineno: int) -> tuple[str, str, int]:
    if len(fields) != 3:
        raise ValueError(f"{path}:{lineno}: expected 3 tab-separated fields "
                         f"(query-id, corpus-id, score), got {len(fields)}")
    try:
        grade = int(fields[2])
    except ValueError:
        raise ValueError(f"{path}:{lineno}: score {fields[2]!r} is not an integer") from None
    return fields[0], fields[1], grade


def corpus_hash(docs: Sequence[Document]) -> str:
    """sha256 (hex) over ids and full texts, in order."""
    return hash_strings(s for d in docs for s in (d.id, d.full_text))


def hash_strings(strings: Iterator[str] | Sequence[str]) -> str:
    """sha256 over a sequence of strings, length-prefixed so boundaries are unambiguous."""
    h = hashlib.sha256()
    for s in strings:
        data = s.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
