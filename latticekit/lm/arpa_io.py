"""ARPA back-off files: a fast writer printing like OpenGrm, and a pure-Python reader.

The writer prints every number with 7 significant digits (C's ``%.7g``, what OpenGrm's
``ngramprint --ARPA`` gives: ``-0.7306006``, ``7.141721e-05``, ``-0``), omits the back-off
field where an n-gram opens no state (highest order, n-grams ending in ``</s>``, NaN weights)
and writes to a temporary file in the target directory, renamed into place when complete.
Lines are formatted by the C++ core, blocks of rows in two threads.

The reader is independent of the C++ core: it is used by the tests and by
:mod:`latticekit.lm` tools that need the n-gram tables of an ARPA file.
"""

from __future__ import annotations

import functools
import gzip
import io
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from latticekit import _core
from latticekit._files import atomic_write, file_error
from latticekit.errors import ArpaFormatError
from latticekit.lm.model import BackoffModel
from latticekit.ngram_trie import EOS, SPECIAL_WORDS

__all__ = ["write_arpa", "write_model_arpa", "read_arpa", "arpa_text"]

_BLOCK_ROWS = 100_000

Table = Tuple[np.ndarray, np.ndarray, np.ndarray]


def _ngram_blocks(words: Sequence[str], tables: Sequence[Table]) -> Iterator[Callable[[], bytes]]:
    """The ARPA text as a sequence of jobs, each giving the bytes of one piece, in order."""
    blob = "".join(words).encode("utf-8")
    offsets = np.zeros(len(words) + 1, np.int64)
    offsets[1:] = np.cumsum([len(w.encode("utf-8")) for w in words])
    eos = _eos_id(words)
    order = len(tables)
    header = "\n\\data\\\n" + "".join(f"ngram {k}={len(ids)}\n" for k, (ids, _, _) in enumerate(tables, 1))
    yield functools.partial(str.encode, header + "\n")
    for k, (ids, prob, backoff) in enumerate(tables, start=1):
        yield functools.partial(str.encode, f"\\{k}-grams:\n")
        ids = np.ascontiguousarray(np.asarray(ids).reshape(-1, k), dtype=np.int32)
        prob = np.ascontiguousarray(prob, dtype=np.float64)
        backoff = np.ascontiguousarray(backoff, dtype=np.float64)
        for start in range(0, len(ids), _BLOCK_ROWS):
            sl = slice(start, start + _BLOCK_ROWS)
            if k == order:
                show = np.zeros(len(ids[sl]), bool)
            else:
                show = ~np.isnan(backoff[sl]) & (ids[sl, -1] != eos)
            yield functools.partial(
                _core.format_arpa_lines, blob, offsets, ids[sl], prob[sl], backoff[sl], show.view(np.uint8)
            )
        yield functools.partial(str.encode, "\n")
    yield functools.partial(str.encode, "\\end\\\n")


def _write_tables(out: IO[bytes], words: Sequence[str], tables: Sequence[Table], threads: int = 2) -> None:
    """Write the ARPA text, formatting blocks in ``threads`` threads (the C++ formatter
    releases the GIL) and writing them in order."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: "deque[Future[bytes]]" = deque()
        for job in _ngram_blocks(words, tables):
            pending.append(pool.submit(job))
            while len(pending) > 2 * threads:
                out.write(pending.popleft().result())
        while pending:
            out.write(pending.popleft().result())


def _eos_id(words: Sequence[str]) -> int:
    return EOS if len(words) > EOS and words[EOS] == "</s>" else -1


def write_arpa(path: str, words: Sequence[str], tables: Sequence[Table]) -> None:
    """Write n-gram tables as an ARPA file, printed like OpenGrm.

    Args:
        path: output file (``.gz`` suffix: gzip-compressed). Written to a temporary file in
            the same directory and renamed, so readers never see a partial file.
        words: the word table; ids index it.
        tables: per order ``k``: ids (int `[n, k]`), log10_prob (float `[n]`),
            log10_backoff (float `[n]`, NaN where the n-gram opens no state).

    Raises:
        OSError: if the file cannot be written.
        ValueError: if the tables are malformed.
    """
    for k, (ids, prob, backoff) in enumerate(tables, start=1):
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != k or len(prob) != len(ids) or len(backoff) != len(ids):
            raise ValueError(f"table of order {k} must be ids [n, {k}], log10_prob [n], log10_backoff [n]")
        if len(ids) and (ids.min() < 0 or ids.max() >= len(words)):
            raise ValueError(f"table of order {k} has word ids outside the word table")
    with atomic_write(path) as raw:
        binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb") if str(path).endswith(".gz") else raw
        _write_tables(binary, words, tables)
        if binary is not raw:
            binary.close()


def _model_tables(model: BackoffModel) -> List[Table]:
    return [
        (model.ngram_ids(k), model.log10_prob[k - 1], model.log10_backoff[k - 1])
        for k in range(1, model.order + 1)
    ]


def write_model_arpa(path: str, model: BackoffModel) -> None:
    """Write a :class:`BackoffModel` as an ARPA file (see :func:`write_arpa`)."""
    write_arpa(path, model.words, _model_tables(model))


def arpa_text(model: BackoffModel) -> str:
    """The ARPA text of a model, as a string (small models, tests)."""
    buf = io.BytesIO()
    _write_tables(buf, model.words, _model_tables(model), threads=1)
    return buf.getvalue().decode("utf-8")


def _open_text(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def read_arpa(path: str, words: Optional[Sequence[str]] = None) -> BackoffModel:
    """Read an ARPA back-off file into a :class:`BackoffModel` (pure Python).

    Args:
        path: the ARPA file (``.gz`` allowed).
        words: optional word table to use for ids (``<unk>``, ``<s>``, ``</s>`` first);
            words of the file not in it are appended. By default ids follow first appearance.

    Returns:
        The model; log10 values are kept as float64 exactly as printed.

    Raises:
        ArpaFormatError: naming the file and line, if the file is malformed (a corrupt gzip
            stream included).
        FileAccessError: if it cannot be read (an ``OSError``).
    """
    table: List[str] = list(words) if words is not None else list(SPECIAL_WORDS)
    if tuple(table[:3]) != SPECIAL_WORDS:
        raise ArpaFormatError(f"word table must start with {SPECIAL_WORDS}", path, 0)
    index: Dict[str, int] = {w: i for i, w in enumerate(table)}
    declared: List[int] = []
    ngrams: List[List[List[str]]] = []
    try:
        with _open_text(path) as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as exc:
        raise ArpaFormatError(f"{path}: not UTF-8 text ({exc})", path, 0) from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ArpaFormatError(f"{path}: corrupt gzip stream: {exc}", path, 0) from exc
    except OSError as exc:
        raise file_error(exc, "read", path) from exc
    i = 0
    while i < len(lines) and lines[i].strip() != "\\data\\":
        i += 1
    if i == len(lines):
        raise ArpaFormatError(f"{path}: no \\data\\ section", path, 0)
    i += 1
    while i < len(lines) and lines[i].startswith("ngram "):
        try:
            k_str, n_str = lines[i][6:].split("=")
            k, n = int(k_str), int(n_str)
        except ValueError as exc:
            raise ArpaFormatError(f"{path}:{i + 1}: bad count line {lines[i]!r}", path, i + 1) from exc
        if k != len(declared) + 1:
            raise ArpaFormatError(f"{path}:{i + 1}: orders must be listed 1, 2, ...", path, i + 1)
        declared.append(n)
        i += 1
    if not declared:
        raise ArpaFormatError(f"{path}: no 'ngram N=count' lines", path, 0)
    for k in range(1, len(declared) + 1):
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i == len(lines) or lines[i].strip() != f"\\{k}-grams:":
            raise ArpaFormatError(f"{path}:{i + 1}: expected \\{k}-grams:", path, min(i + 1, len(lines)))
        i += 1
        rows = []
        while i < len(lines) and lines[i].strip() and not lines[i].startswith("\\"):
            parts = lines[i].split("\t")
            if len(parts) not in (2, 3) or len(parts[1].split(" ")) != k:
                raise ArpaFormatError(
                    f"{path}:{i + 1}: expected 'log10_prob<TAB>{k} words[<TAB>backoff]'", path, i + 1
                )
            rows.append(parts)
            i += 1
        if len(rows) != declared[k - 1]:
            raise ArpaFormatError(
                f"{path}:{i}: {k}-grams: header says {declared[k - 1]}, found {len(rows)}", path, i
            )
        ngrams.append(rows)
    ids_per_order = []
    probs = []
    backoffs = []
    for k, rows in enumerate(ngrams, start=1):
        ids = np.empty((len(rows), k), np.int64)
        prob = np.empty(len(rows))
        bo = np.full(len(rows), np.nan)
        for r, parts in enumerate(rows):
            for j, w in enumerate(parts[1].split(" ")):
                if w not in index:
                    index[w] = len(table)
                    table.append(w)
                ids[r, j] = index[w]
            try:
                prob[r] = float(parts[0])
                if len(parts) == 3:
                    bo[r] = float(parts[2])
            except ValueError as exc:
                raise ArpaFormatError(f"{path}: bad number in {k}-gram {parts[1]!r}", path, 0) from exc
        ids_per_order.append(ids)
        probs.append(prob)
        backoffs.append(bo)
    try:
        return BackoffModel.from_arrays(table, ids_per_order, probs, backoffs)
    except ValueError as exc:
        raise ArpaFormatError(f"{path}: {exc}", path, 0) from exc
