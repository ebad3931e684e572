"""The embedded corpus: English text that ships with every Python interpreter.

`configs/tiny.py` must run with no download, so its corpus is the documentation the
interpreter already carries: the language reference topics behind `help()`
(`pydoc_data.topics`, ~465 KB) and the docstrings of the standard library, read by
parsing its `.py` files with `ast` (never importing them: imports have side effects
and some modules only import on one platform).

A document is a list of segments (sentences). Paragraphs that look like code (indented
blocks, doctest `>>>` lines) are dropped, whitespace is normalised, and prose is split
into sentences at `.`, `!` or `?` followed by whitespace and a capital letter, digit,
quote or bracket. The order is deterministic (sorted topic names, then sorted paths), so
the corpus depends only on the interpreter's version.
"""

from __future__ import annotations

import ast
import collections
import functools
import itertools
import os
import re
import sysconfig
import zlib
from collections.abc import Iterator

from pydoc_data import topics as pydoc_topics

# Directories that hold tests, third-party packages or generated data rather than
# documentation prose.
_SKIPPED_DIRS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "__pycache__",
        "pydoc_data",  # Its topics.py is the topics dict itself: read once, above.
        "lib2to3",
        "turtledemo",
        "ensurepip",
    }
)

# `ast.parse` runs at ~3 MB of source per second on one core; the files kept hold ~10 MB
# (~1.5 MB of docstring sentences, ~3.6 s). Parsing the files richest in triple-quoted text
# first, up to this much source, keeps ~1.3 MB of them in ~1.6 s.
DEFAULT_MAX_PARSE_BYTES = 6_000_000

_TRIPLE_QUOTED = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.DOTALL)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_RULE_LINE = re.compile(r"^[\s*=\-~^#+_]*$")  # Heading underlines such as '*****'.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_WHITESPACE = re.compile(r"\s+")


def text_to_segments(text: str) -> list[str]:
    """Splits documentation text into sentences, dropping code blocks and rule lines."""
    segments = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        if not paragraph.strip() or paragraph[:1].isspace():
            continue  # Empty, or an indented (code / grammar) block.
        if paragraph.startswith((">>>", "...")):
            continue  # A doctest.
        lines = [line for line in paragraph.splitlines() if not _RULE_LINE.match(line)]
        prose = _WHITESPACE.sub(" ", " ".join(lines)).strip()
        segments.extend(s for s in _SENTENCE_END.split(prose) if s)
    return segments


def pydoc_topic_documents() -> Iterator[list[str]]:
    """Yields one document per `help()` topic, in sorted topic order."""
    for name in sorted(pydoc_topics.topics):
        segments = text_to_segments(pydoc_topics.topics[name])
        if segments:
            yield segments


def stdlib_source_files(stdlib_dir: str | None = None) -> list[str]:
    """Returns the standard library's documentation-bearing `.py` files, sorted."""
    root = stdlib_dir or sysconfig.get_paths()["stdlib"]
    paths = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
        paths.extend(
            os.path.join(directory, f)
            for f in sorted(files)
            if f.endswith(".py") and not f.startswith("test_")
        )
    return sorted(paths)


def _module_docstrings(tree: ast.Module) -> Iterator[str]:
    """Yields the docstrings of a module, its classes and functions in source order."""
    nodes = [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                yield docstring
        # Reversed so that popping from the end visits children in source order.
        nodes.extend(reversed([n for n in ast.iter_child_nodes(node) if _may_hold_docstrings(n)]))


def _may_hold_docstrings(node: ast.AST) -> bool:
    return isinstance(
        node,
        (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.Try, ast.With),
    )


def stdlib_docstring_documents(
    max_parse_bytes: int | None = DEFAULT_MAX_PARSE_BYTES,
    skipped: collections.Counter | None = None,
    stdlib_dir: str | None = None,
) -> Iterator[list[str]]:
    """Yields one document per standard-library module: its docstrings' sentences.

    Args:
      max_parse_bytes: how much source to parse at most (None: all). Files are chosen
        richest-in-triple-quoted-text first, then read in sorted path order.
      skipped: if given, counts files skipped, by reason ('unreadable', 'syntax_error',
        'over_parse_budget', 'no_docstrings').
      stdlib_dir: the library root; default: this interpreter's.
    """
    skipped = collections.Counter() if skipped is None else skipped
    sources = {}
    for path in stdlib_source_files(stdlib_dir):
        try:
            with open(path, encoding="utf-8") as f:
                sources[path] = f.read()
        except (OSError, UnicodeDecodeError):
            skipped["unreadable"] += 1
    chosen = _richest_in_docstrings(sources, max_parse_bytes)
    skipped["over_parse_budget"] += len(sources) - len(chosen)
    for path in sorted(chosen):
        try:
            tree = ast.parse(sources[path], filename=path)
        except (SyntaxError, ValueError):  # ValueError: source holds NUL bytes.
            skipped["syntax_error"] += 1
            continue
        segments = [s for doc in _module_docstrings(tree) for s in text_to_segments(doc)]
        if segments:
            yield segments
        else:
            skipped["no_docstrings"] += 1


def _richest_in_docstrings(sources: dict[str, str], max_parse_bytes: int | None) -> set[str]:
    """Picks files by triple-quoted text per byte (a cheap docstring estimate) up to a budget."""
    if max_parse_bytes is None:
        return set(sources)

    def density(path: str) -> tuple[float, str]:
        source = sources[path]
        quoted = sum(m.end() - m.start() for m in _TRIPLE_QUOTED.finditer(source))
        return (-quoted / max(1, len(source)), path)

    chosen, parsed = set(), 0
    for path in sorted(sources, key=density):
        if parsed + len(sources[path]) > max_parse_bytes:
            continue
        chosen.add(path)
        parsed += len(sources[path])
    return chosen


@functools.lru_cache(maxsize=1)
def _embedded_corpus(max_parse_bytes: int | None) -> tuple[tuple[str, ...], ...]:
    # The corpus is a constant of the interpreter; building it costs seconds, and the
    # tokenizer, the train split and the eval split all read it.
    documents = itertools.chain(
        pydoc_topic_documents(), stdlib_docstring_documents(max_parse_bytes)
    )
    # Some help() topics are aliases with the same text; a copy on each side of the
    # train/eval split would leak eval text into training.
    return tuple(dict.fromkeys(tuple(d) for d in documents))


def embedded_documents(
    max_parse_bytes: int | None = DEFAULT_MAX_PARSE_BYTES,
) -> Iterator[list[str]]:
    """Yields the embedded corpus: help() topics, then stdlib docstrings, as segment lists.

    Exact duplicate documents are kept once.
    """
    for document in _embedded_corpus(max_parse_bytes):
        yield list(document)


def is_eval_document(index: int, eval_fraction: float) -> bool:
    """Whether document `index` of a source is held out for evaluation.

    A hash of the index (not a random draw) decides, so every process and every run
    agrees on the split without coordination, and the split does not depend on the seed.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction} must be in [0, 1)")
    return zlib.crc32(index.to_bytes(8, "little")) < eval_fraction * 2**32


def file_document_id(file_index: int, index_in_file: int) -> int:
    """The index is_eval_document takes for a document of a file source: its file's place among the
    source's sorted files, and its place in that file. The split then does not move with the order
    files are read in, nor with the number of hosts (for one file, it is the document's index)."""
    return (file_index << 32) | index_in_file
