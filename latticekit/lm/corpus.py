"""Reading training text into chunks of ``<s> ... </s>`` word-id streams.

Three kinds of input, each line (or array) one sentence:

* raw text, words separated by whitespace (:func:`text_chunks`);
* raw text encoded by a tokenizer (:func:`tokenizer_chunks`): an HF ``tokenizers`` JSON file or
  a local ``transformers`` tokenizer directory;
* pre-tokenized files of decimal token ids (:func:`token_id_chunks`) or numpy arrays of ids
  (:func:`array_chunks`).

Words get internal ids in order of first appearance after ``<unk>``, ``<s>``, ``</s>`` (as
OpenGrm's ``ngramsymbols`` does), kept in a :class:`WordTable`. Empty lines are skipped.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from latticekit import _core
from latticekit._arrays import _INT32_MAX
from latticekit.errors import VocabularyError
from latticekit.lm.counting import CorpusError
from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS

_INT32_LIMIT = int(_INT32_MAX) + 1

__all__ = [
    "WordTable",
    "TokenIdTable",
    "text_chunks",
    "token_id_chunks",
    "tokenizer_chunks",
    "array_chunks",
    "load_tokenizer",
    "lines_to_stream",
]

DEFAULT_CHUNK_TOKENS = 2_000_000


class WordTable:
    """String words to internal ids, in order of first appearance."""

    def __init__(self) -> None:
        self.words: List[str] = list(SPECIAL_WORDS)
        self._index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, tokens: Sequence[str]) -> np.ndarray:
        """Internal ids of ``tokens`` (a flat list of words), adding new words.

        Only distinct words go through Python; the mapping itself is vectorised.
        """
        if not tokens:
            return np.zeros(0, np.int64)
        arr = np.asarray(tokens, dtype=object)
        uniq, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for u in np.argsort(first, kind="stable"):  # distinct words, first-appearance order
            w = uniq[u]
            i = self._index.get(w)
            if i is None:
                i = len(self.words)
                self._index[w] = i
                self.words.append(w)
            ids[u] = i
        return ids[inverse]


class TokenIdTable:
    """Token ids to internal ids, in order of first appearance; words are decimal strings.

    Ids below ``DENSE_LIMIT`` map through a dense array (fast for any real tokenizer's
    vocabulary); larger ones, up to int32's maximum, through a sorted one, so that a stray
    huge id costs neither memory nor time.

    Args:
        vocab_size: when given, ids must be in ``[0, vocab_size)``.
    """

    DENSE_LIMIT = 1 << 22

    def __init__(self, vocab_size: Optional[int] = None) -> None:
        self.vocab_size = vocab_size
        self._internal = np.full(0, -1, np.int64)  # dense: token id -> internal id, or -1
        self._big_tokens = np.zeros(0, np.int64)    # sorted token ids >= DENSE_LIMIT
        self._big_internal = np.zeros(0, np.int64)
        self.token_of_word: List[int] = [-1, -1, -1]

    @property
    def words(self) -> List[str]:
        """The word table (``<unk>``, ``<s>``, ``</s>``, then token ids as decimal strings)."""
        return list(SPECIAL_WORDS) + [str(t) for t in self.token_of_word[3:]]

    def __len__(self) -> int:
        return len(self.token_of_word)

    def ids(
        self,
        tokens: np.ndarray,
        path: str = "",
        line_lengths: Optional[np.ndarray] = None,
        first_line: int = 1,
    ) -> np.ndarray:
        """Internal ids of token ids, adding new ones.

        Args:
            tokens: int token ids.
            path: the file they come from (for error messages).
            line_lengths: ids per line of the file from ``first_line`` on (for error messages).
            first_line: 1-based line of the first id.

        Raises:
            VocabularyError: for a negative id, one beyond ``vocab_size``, or one beyond
                int32 (token ids are int32 everywhere in latticekit).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) == 0:
            return tokens
        limit = _INT32_LIMIT if self.vocab_size is None else min(self.vocab_size, _INT32_LIMIT)
        bad = (tokens < 0) | (tokens >= limit)
        if bad.any():
            at = int(np.argmax(bad))
            line = 0
            if line_lengths is not None:
                line = first_line + int(np.searchsorted(np.cumsum(line_lengths), at, side="right"))
            where = f"{path}:{line}: " if path else ""
            value = int(tokens[at])
            if value >= _INT32_LIMIT:
                # The parser saturates ids of 19 digits or more at int64's maximum.
                shown = "with 19 digits or more" if value == np.iinfo(np.int64).max else str(value)
                raise VocabularyError(f"{where}token id {shown} does not fit int32")
            raise VocabularyError(
                f"{where}token id {value} is outside the vocabulary"
                + (f" of {self.vocab_size} ids" if self.vocab_size is not None else "")
            )
        mapped = self._lookup(tokens)
        new = mapped < 0
        if new.any():
            uniq, first = np.unique(tokens[new], return_index=True)
            uniq = uniq[np.argsort(first, kind="stable")]
            start = len(self.token_of_word)
            self._insert(uniq, np.arange(start, start + len(uniq), dtype=np.int64))
            self.token_of_word.extend(uniq.tolist())
            mapped = self._lookup(tokens)
        return mapped

    def _lookup(self, tokens: np.ndarray) -> np.ndarray:
        """Internal ids, -1 for tokens not seen yet."""
        if tokens.max() < len(self._internal):
            return self._internal[tokens]
        out = np.full(len(tokens), -1, np.int64)
        dense = tokens < len(self._internal)
        out[dense] = self._internal[tokens[dense]]
        big = tokens >= self.DENSE_LIMIT
        if big.any() and len(self._big_tokens):
            at = np.searchsorted(self._big_tokens, tokens[big])
            at_c = np.minimum(at, len(self._big_tokens) - 1)
            hit = self._big_tokens[at_c] == tokens[big]
            out[np.flatnonzero(big)[hit]] = self._big_internal[at_c[hit]]
        return out

    def _insert(self, tokens: np.ndarray, internal: np.ndarray) -> None:
        small = tokens < self.DENSE_LIMIT
        if small.any():
            top = int(tokens[small].max()) + 1
            if top > len(self._internal):
                grown = np.full(min(max(top, 2 * len(self._internal)), self.DENSE_LIMIT), -1, np.int64)
                grown[: len(self._internal)] = self._internal
                self._internal = grown
            self._internal[tokens[small]] = internal[small]
        if not small.all():
            keys = np.concatenate([self._big_tokens, tokens[~small]])
            values = np.concatenate([self._big_internal, internal[~small]])
            order = np.argsort(keys, kind="stable")
            self._big_tokens, self._big_internal = keys[order], values[order]


def lines_to_stream(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Insert ``<s>`` and ``</s>`` around sentences given as flat ids plus lengths.

    Args:
        ids: int internal ids of every sentence, back to back.
        lengths: int words per sentence.

    Returns:
        int32 stream of ``len(ids) + 2 * len(lengths)`` ids.
    """
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    out = np.empty(len(ids) + 2 * n, np.int32)
    ends = np.cumsum(lengths + 2)
    starts = ends - lengths - 2
    out[starts] = BOS
    out[ends - 1] = EOS
    word_pos = np.ones(len(out), bool)
    word_pos[starts] = False
    word_pos[ends - 1] = False
    out[word_pos] = ids
    return out


def _read_lines(path: str, max_lines: int) -> Iterator[List[bytes]]:
    with open(path, "rb") as f:
        while True:
            lines = f.readlines(max_lines * 64)
            if not lines:
                return
            yield lines


def _decode(lines: List[bytes], path: str, first_line: int) -> List[str]:
    try:
        return b"".join(lines).decode("utf-8").split("\n")[: len(lines)]
    except UnicodeDecodeError:
        for i, raw in enumerate(lines):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(
                    f"{path}:{first_line + i}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                    path,
                    first_line + i,
                ) from exc
        raise


def text_chunks(
    paths: Sequence[str], table: WordTable, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Iterator[np.ndarray]:
    """Streams of raw text files, one sentence per line, words split on whitespace.

    Args:
        paths: text files (UTF-8).
        table: the word table, filled as words are seen.
        chunk_tokens: approximate words per chunk.

    Yields:
        int32 ``<s> ... </s>`` streams.

    Raises:
        CorpusError: naming the file and line, for text that is not UTF-8.
        OSError: if a file cannot be read.
    """
    for path in paths:
        line_no = 1
        for raw in _read_lines(path, max(chunk_tokens // 8, 1000)):
            lines = _decode(raw, path, line_no)
            line_no += len(raw)
            split = [l.split() for l in lines]
            lengths = np.fromiter((len(s) for s in split), np.int64, count=len(split))
            keep = lengths > 0
            flat = [w for s in split for w in s]
            yield lines_to_stream(table.ids(flat), lengths[keep])


def _read_blocks(path: str, block_bytes: int) -> Iterator[bytes]:
    """Blocks of about ``block_bytes`` bytes of whole lines (a longer line is one block)."""
    with open(path, "rb") as f:
        carry = b""
        while True:
            data = f.read(block_bytes)
            if not data:
                if carry:
                    yield carry
                return
            data = carry + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            yield data[:cut]


def token_id_chunks(
    paths: Sequence[str], table: TokenIdTable, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Iterator[np.ndarray]:
    """Streams of pre-tokenized files: one sentence of decimal token ids per line.

    Lines are parsed by the C++ core, a block of about ``8 * chunk_tokens`` bytes at a time.

    Raises:
        CorpusError: naming file and line, for a line that is not decimal ids or not UTF-8.
        VocabularyError: for an id outside the table's vocabulary.
    """
    for path in paths:
        line_no = 1
        for data in _read_blocks(path, max(chunk_tokens * 8, 8000)):
            tokens, lengths, bad = _core.parse_id_lines(data)
            if bad:
                _raise_bad_id_line(data, path, line_no, bad)
            ids = table.ids(tokens, path, line_lengths=lengths, first_line=line_no)
            line_no += len(lengths)
            yield lines_to_stream(ids, lengths[lengths > 0])


def _raise_bad_id_line(data: bytes, path: str, first_line: int, bad: int) -> None:
    """Raise the CorpusError for line ``bad`` (1-based in ``data``) of a block of id lines."""
    raw = data.split(b"\n")[bad - 1]
    line = first_line + bad - 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})", path, line
        ) from exc
    for w in text.split():
        if not (w.isascii() and w.isdigit()):
            raise CorpusError(f"{path}:{line}: {w!r} is not a decimal token id", path, line)
    raise CorpusError(f"{path}:{line}: could not parse token ids", path, line)


def array_chunks(
    arrays: Iterable[np.ndarray], table: TokenIdTable, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Iterator[np.ndarray]:
    """Streams of numpy arrays of token ids, one array per sentence."""
    batch: List[np.ndarray] = []
    size = 0
    for a in arrays:
        a = np.asarray(a).reshape(-1)
        if a.dtype.kind not in "iu":
            raise CorpusError(f"token id arrays must be integers, got {a.dtype}")
        if len(a) == 0:
            continue
        batch.append(a)
        size += len(a)
        if size >= chunk_tokens:
            yield _arrays_to_stream(batch, table)
            batch, size = [], 0
    if batch:
        yield _arrays_to_stream(batch, table)


def _arrays_to_stream(batch: List[np.ndarray], table: TokenIdTable) -> np.ndarray:
    lengths = np.fromiter((len(a) for a in batch), np.int64, count=len(batch))
    return lines_to_stream(table.ids(np.concatenate(batch)), lengths)


def load_tokenizer(path: str) -> Any:
    """Load a tokenizer: an HF ``tokenizers`` JSON file or a ``transformers`` directory.

    Returns:
        An object with ``encode_batch(lines) -> list[list[int]]`` semantics (see
        :func:`tokenizer_chunks`) and a ``vocab_size``.

    Raises:
        OSError: if nothing loadable is at ``path``.
    """
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        return _HFTokenizer(tok)
    if os.path.isdir(path):
        from transformers import AutoTokenizer

        return _TransformersTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    raise OSError(f"no tokenizer at {path!r} (expected tokenizer.json or a tokenizer directory)")


class _HFTokenizer:
    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, lines: List[str]) -> List[List[int]]:
        return [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]


class _TransformersTokenizer:
    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.vocab_size = len(tok)

    def encode_batch(self, lines: List[str]) -> List[List[int]]:
        return self.tok(lines, add_special_tokens=False)["input_ids"]


def tokenizer_chunks(
    paths: Sequence[str], tokenizer: Any, table: TokenIdTable, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Iterator[np.ndarray]:
    """Streams of raw text files encoded line by line with ``tokenizer`` (no special tokens).

    Raises:
        CorpusError: naming file and line, for text that is not UTF-8.
    """
    for path in paths:
        line_no = 1
        for raw in _read_lines(path, max(chunk_tokens // 32, 1000)):
            lines = [l for l in _decode(raw, path, line_no) if l.strip()]
            line_no += len(raw)
            encoded = tokenizer.encode_batch(lines) if lines else []
            arrays = [np.asarray(e, np.int64) for e in encoded if len(e)]
            if arrays:
                yield _arrays_to_stream(arrays, table)
