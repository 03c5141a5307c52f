"""ARPA text out: the one ARPA writer, for ``NGramLM.write_arpa`` and :mod:`latticekit.lm`.

It prints every number with 7 significant digits (C's ``%.7g``, what OpenGrm's
``ngramprint --ARPA`` gives: ``-0.7306006``, ``7.141721e-05``, ``-0``), omits the back-off
field where an n-gram opens no state (highest order, n-grams ending in ``</s>``, NaN weights)
and writes to a temporary file in the target directory, renamed into place when complete.
Lines are formatted by the C++ core, blocks of rows in two threads.

Reading ARPA text is the C++ core's (``NGramLM.from_arpa``); :func:`latticekit.lm.read_arpa`
reads it for model building (see its docstring for why it is a second reader).
"""

from __future__ import annotations

import functools
import gzip
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Callable, Iterator, Sequence, Tuple, cast

import numpy as np

from latticekit import _core
from latticekit._files import atomic_write
from latticekit.ngram_trie import EOS

__all__ = ["write_arpa", "write_arpa_text"]

Table = Tuple[np.ndarray, np.ndarray, np.ndarray]

_BLOCK_ROWS = 100_000


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


def write_arpa_text(out: IO[bytes], words: Sequence[str], tables: Sequence[Table], threads: int = 2) -> None:
    """Write the ARPA text of n-gram tables to a binary stream, formatting blocks in
    ``threads`` threads (the C++ formatter releases the GIL) and writing them in order.

    Args:
        out: the stream.
        words, tables: as in :func:`write_arpa` (not checked here).
        threads: formatting threads.
    """
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
        # a GzipFile is a binary stream; typeshed does not derive it from IO[bytes]
        binary = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="wb")) if str(path).endswith(".gz") else raw
        write_arpa_text(binary, words, tables)
        if binary is not raw:
            binary.close()
