"""ARPA back-off files: a fast writer printing like OpenGrm, and a pure-Python reader.

The writer prints every number with 7 significant digits (C's ``%.7g``, what OpenGrm's
``ngramprint --ARPA`` gives: ``-0.7306006``, ``7.141721e-05``, ``-0``), omits the back-off
field where an n-gram opens no state (highest order, n-grams ending in ``</s>``, NaN weights)
and writes to a temporary file in the target directory, renamed into place when complete.

The reader is independent of the C++ core: it is used by the tests and by
:mod:`latticekit.lm` tools that need the n-gram tables of an ARPA file.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
from typing import IO, Dict, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.errors import ArpaFormatError
from latticekit.lm.model import BackoffModel
from latticekit.lm.trie import EOS, SPECIAL_WORDS

__all__ = ["write_arpa", "write_model_arpa", "read_arpa", "arpa_text"]

_BLOCK_ROWS = 100_000

Table = Tuple[np.ndarray, np.ndarray, np.ndarray]


def _format_block(
    words: np.ndarray, ids: np.ndarray, prob: np.ndarray, backoff: np.ndarray, show_bo: np.ndarray
) -> str:
    n, k = ids.shape
    with_bo = "%.7g\t" + " ".join(["%s"] * k) + "\t%.7g\n"
    without_bo = "%.7g\t" + " ".join(["%s"] * k) + "\n"
    fmt = "".join(np.where(show_bo, with_bo, without_bo).tolist())
    fields = np.empty((n, k + 2), dtype=object)
    fields[:, 0] = prob.astype(np.float64).tolist()
    for j in range(k):
        fields[:, j + 1] = words[ids[:, j]]
    fields[:, k + 1] = backoff.astype(np.float64).tolist()
    mask = np.ones((n, k + 2), bool)
    mask[:, k + 1] = show_bo
    return fmt % tuple(fields[mask].tolist())


def _write_tables(out: IO[str], words: Sequence[str], tables: Sequence[Table]) -> None:
    word_array = np.empty(len(words), dtype=object)
    word_array[:] = list(words)
    order = len(tables)
    out.write("\n\\data\\\n")
    for k, (ids, _, _) in enumerate(tables, start=1):
        out.write(f"ngram {k}={len(ids)}\n")
    out.write("\n")
    for k, (ids, prob, backoff) in enumerate(tables, start=1):
        out.write(f"\\{k}-grams:\n")
        ids = np.asarray(ids).reshape(-1, k)
        prob = np.asarray(prob)
        backoff = np.asarray(backoff)
        for start in range(0, len(ids), _BLOCK_ROWS):
            sl = slice(start, start + _BLOCK_ROWS)
            block_ids = ids[sl]
            block_bo = backoff[sl]
            if k == order:
                show = np.zeros(len(block_ids), bool)
            else:
                show = ~np.isnan(block_bo) & (block_ids[:, -1] != _eos_id(words))
            out.write(_format_block(word_array, block_ids, prob[sl], block_bo, show))
        out.write("\n")
    out.write("\\end\\\n")


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
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".arpa-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw:
            binary: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb") if path.endswith(".gz") else raw
            text = io.TextIOWrapper(binary, encoding="utf-8", newline="\n")
            _write_tables(text, words, tables)
            text.flush()
            text.detach()
            if binary is not raw:
                binary.close()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
    buf = io.StringIO()
    _write_tables(buf, model.words, _model_tables(model))
    return buf.getvalue()


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
        ArpaFormatError: naming the file and line, if the file is malformed.
        OSError: if it cannot be read.
    """
    table: List[str] = list(words) if words is not None else list(SPECIAL_WORDS)
    if tuple(table[:3]) != SPECIAL_WORDS:
        raise ArpaFormatError(f"word table must start with {SPECIAL_WORDS}", path, 0)
    index: Dict[str, int] = {w: i for i, w in enumerate(table)}
    declared: List[int] = []
    ngrams: List[List[List[str]]] = []
    try:
        f = _open_text(path)
        lines = f.read().split("\n")
        f.close()
    except UnicodeDecodeError as exc:
        raise ArpaFormatError(f"{path}: not UTF-8 text ({exc})", path, 0) from exc
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
