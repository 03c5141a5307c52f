"""ARPA back-off files for model building: the float64 reader, and writers of BackoffModels.

latticekit reads ARPA text in two places, one per purpose. ``NGramLM.from_arpa`` (the C++
core) compiles a float32 model for scoring and search. :func:`read_arpa` here reads the n-gram
tables into a :class:`~latticekit.lm.model.BackoffModel` for estimation, pruning and
perplexity, keeping every value in float64 as printed: the model-building tools must write back
OpenGrm-identical ARPA text, which float32 values would not reproduce (see
:class:`~latticekit.lm.model.BackoffModel`). Both number the special words ``<unk>``, ``<s>``,
``</s>`` as ids 0, 1, 2 (:mod:`latticekit.ngram_trie`); :func:`read_arpa` numbers the other
words in order of first appearance, or by a word table it is given.

Writing is the core's :mod:`latticekit.arpa_writer` (one writer for ``NGramLM.write_arpa``
and for these models); :func:`write_arpa` is re-exported from it.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO, Dict, List, Optional, Sequence

import numpy as np

from latticekit._files import file_error
from latticekit.arpa_writer import write_arpa, write_arpa_text
from latticekit.errors import ArpaFormatError
from latticekit.lm.model import BackoffModel
from latticekit.ngram_trie import SPECIAL_WORDS

__all__ = ["write_arpa", "write_model_arpa", "read_arpa", "arpa_text"]


def write_model_arpa(path: str, model: BackoffModel) -> None:
    """Write a :class:`BackoffModel` as an ARPA file (see :func:`write_arpa`)."""
    write_arpa(path, model.words, model.log10_tables())


def arpa_text(model: BackoffModel) -> str:
    """The ARPA text of a model, as a string (small models, tests)."""
    buf = io.BytesIO()
    write_arpa_text(buf, model.words, model.log10_tables(), threads=1)
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
        The model; log10 values are kept as float64 exactly as printed (the reason:
        :class:`~latticekit.lm.model.BackoffModel`).

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
