"""BEIR's dataset layout (Thakur et al. 2021), read and checked before anything is embedded or written.

    DIR/<name>/corpus.jsonl      {"_id", "title", "text"} per line: the documents searched
    DIR/<name>/queries.jsonl     {"_id", "text"} per line
    DIR/<name>/qrels/test.tsv    query-id <TAB> corpus-id <TAB> score, after a header line

The corpus is read as a stream, a chunk of documents at a time, twice (once to check it, once to embed it):
only the queries, the qrels and one chunk are ever held, so a corpus larger than memory goes through. The
queries scored are those with a qrels row (BEIR's practice). Every mistake in a file is one line naming the
file and the row.
"""
import dataclasses
import json
from collections.abc import Iterator

from bert_jax import MissingPathError, UserError
from bert_jax.finetune.data import json_object
from bert_jax.storage import paths

FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")
QRELS_HEADER = ["query-id", "corpus-id", "score"]
LAYOUT = "a BEIR dataset folder holds corpus.jsonl, queries.jsonl and qrels/test.tsv"


@dataclasses.dataclass
class Dataset:
    name: str
    folder: str
    num_documents: int
    queries: dict[str, str]  # query id -> text, the queries that have qrels
    qrels: dict[str, dict[str, int]]  # query id -> {corpus id: relevance}

    @property
    def corpus_file(self) -> str:
        return str(paths.path(self.folder) / "corpus.jsonl")

    def documents(self, chunk_size: int) -> Iterator[tuple[list[str], list[dict]]]:
        """The corpus as (ids, documents) chunks of at most chunk_size, in the file's order."""
        ids, docs = [], []
        for _, doc in _json_lines(self.corpus_file):
            ids.append(str(doc["_id"]))
            docs.append(doc)
            if len(ids) == chunk_size:
                yield ids, docs
                ids, docs = [], []
        if ids:
            yield ids, docs


def dataset_names(beir_dir: str) -> list[str]:
    """The datasets under --beir_dir: its subfolders, sorted."""
    root = paths.path(beir_dir)
    if not root.is_dir():
        raise MissingPathError(f"--beir_dir={beir_dir!r} is not a folder ({LAYOUT}, one per subfolder)")
    names = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not names:
        raise UserError(f"--beir_dir={beir_dir!r} has no subfolder: {LAYOUT}, one per subfolder")
    return names


def _json_lines(path: str) -> Iterator[tuple[int, dict]]:
    with paths.path(path).open("r", encoding="utf-8") as f:
        for row, line in enumerate(f, start=1):
            if not line.strip():
                continue
            yield row, json_object(line, path, row, unit="row")


def _text_record(path: str, row: int, record: dict, fields: tuple[str, ...]) -> None:
    for key in fields:
        if not isinstance(record.get(key), (str, int)) or (key != "_id" and not isinstance(record[key], str)):
            raise UserError(f"{path}, row {row}: no {key!r} string (each line holds {', '.join(fields)})")


def _qrels(path: str) -> list[tuple[int, str, str, int]]:
    """(row, query id, corpus id, relevance) of each line after the header."""
    lines = paths.path(path).read_text(encoding="utf-8").splitlines()
    if not lines or [c.strip() for c in lines[0].split("\t")] != QRELS_HEADER:
        raise UserError(f"{path}, row 1: the header is {lines[0].split(chr(9)) if lines else []}, not "
                        f"{QRELS_HEADER} (tab-separated)")
    out = []
    for row, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise UserError(f"{path}, row {row}: {len(fields)} fields, not 3 (query-id, corpus-id, score)")
        try:
            score = int(float(fields[2]))
        except ValueError:
            raise UserError(f"{path}, row {row}: score {fields[2]!r} is not a number") from None
        out.append((row, fields[0].strip(), fields[1].strip(), score))
    return out


def read(beir_dir: str, name: str) -> Dataset:
    """Dataset `name` of --beir_dir, every file checked (the corpus by streaming through it once)."""
    folder = paths.path(beir_dir) / name
    for file in FILES:
        if not (folder / file).exists():
            raise UserError(f"{folder / file} does not exist: {LAYOUT}")
    queries_file, qrels_file, corpus_file = (str(folder / f) for f in ("queries.jsonl", "qrels/test.tsv",
                                                                        "corpus.jsonl"))
    queries = {}
    for row, record in _json_lines(queries_file):
        _text_record(queries_file, row, record, ("_id", "text"))
        queries[str(record["_id"])] = record["text"]
    qrels: dict[str, dict[str, int]] = {}
    unseen: dict[str, int] = {}  # corpus id -> the first qrels row naming it, until the corpus holds it
    for row, query, doc, score in _qrels(qrels_file):
        if query not in queries:
            raise UserError(f"{qrels_file}, row {row}: query-id {query!r} is not in {queries_file}")
        qrels.setdefault(query, {})[doc] = score
        unseen.setdefault(doc, row)
    if not qrels:
        raise UserError(f"{queries_file}: none of its {len(queries)} queries has a row in {qrels_file}")
    num_documents = 0
    for row, record in _json_lines(corpus_file):
        _text_record(corpus_file, row, record, ("_id", "text"))
        if not isinstance(record.get("title", ""), str):
            raise UserError(f"{corpus_file}, row {row}: 'title' is not a string")
        unseen.pop(str(record["_id"]), None)
        num_documents += 1
    if not num_documents:
        raise UserError(f"{corpus_file} holds no document")
    if unseen:
        doc, row = min(unseen.items(), key=lambda kv: kv[1])
        raise UserError(f"{qrels_file}, row {row}: corpus-id {doc!r} is not in {corpus_file}")
    return Dataset(name, str(folder), num_documents, {q: queries[q] for q in qrels}, qrels)


def write(folder: str, corpus: list[dict], queries: list[dict], qrels: list[tuple[str, str, int]]) -> None:
    """A BEIR-layout dataset in `folder`: corpus [{"_id", "title", "text"}], queries [{"_id", "text"}], qrels
    [(query id, corpus id, score)]."""
    root = paths.path(folder)
    paths.write_atomically(root / "corpus.jsonl", "".join(json.dumps(d) + "\n" for d in corpus))
    paths.write_atomically(root / "queries.jsonl", "".join(json.dumps(q) + "\n" for q in queries))
    paths.write_atomically(root / "qrels" / "test.tsv", "\t".join(QRELS_HEADER) + "\n"
                           + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
