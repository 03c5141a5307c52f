"""The n-gram language model: Katz/ARPA back-off semantics, compiled for fast lookups."""

from __future__ import annotations

import math
import os
import zlib
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from latticekit import _core
from latticekit._arrays import token_array
from latticekit._files import atomic_write, checked_path, read_bytes
from latticekit.arpa_writer import write_arpa
from latticekit.errors import ArpaFormatError, LatticeError
from latticekit.fst import ngramlm_to_fst, tables_from_fst

__all__ = ["NGramLM"]

LN10 = math.log(10.0)

NGramTable = Tuple[np.ndarray, np.ndarray, np.ndarray]


class NGramLM:
    """A back-off n-gram model held as a state machine with back-off links.

    Scores follow the ARPA back-off recursion exactly as KenLM computes it:
    ``p(w | h) = P(h w)`` when the n-gram exists, else ``bo(h) * p(w | h[1:])``. A token the
    model lacks is scored as ``<unk>`` (the file's ``<unk>`` entry, or log10 -100 when it has
    none, as KenLM substitutes). All scores returned are natural logs.

    Words are decimal token ids by default (``"1234"`` is token 1234). A ``vocab`` (strings
    indexed by token id, e.g. a tokenizer's vocabulary) maps any other word set.

    Build one with :meth:`from_arpa`, :meth:`load` (the compact binary format written by
    :meth:`save`) or :meth:`from_ngrams`.
    """

    def __init__(self, core: "_core.CoreModel") -> None:
        """Wraps a compiled core model; use the ``from_*`` constructors or :meth:`load`."""
        self._core = core
        self._words: Optional[list[str]] = None

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_arpa(cls, path: "os.PathLike[str] | str", vocab: Optional[Sequence[str]] = None) -> "NGramLM":
        """Reads an ARPA back-off model (plain or gzip-compressed).

        Model values: log-probabilities must be <= 0 and back-off weights finite; a
        log-probability of ``-inf`` (probability zero; also any value below float32's range,
        such as ``-1e39``) is stored as -99, the value SRILM writes for a zero probability.

        Args:
            path: the ARPA file; a name ending in ``.gz`` is decompressed.
            vocab: spelling of each token id, for models whose words are not decimal ids.

        Returns:
            The compiled model.

        Raises:
            ArpaFormatError: the file is malformed or holds a value a model may not have
                (NaN, a positive log-probability, an infinite back-off weight); the message
                names file and line.
            FileAccessError: the file cannot be read (an ``OSError``).
        """
        path = checked_path(path)
        data: Union[bytes, bytearray] = read_bytes(path)
        if path.endswith(".gz") or data[:2] == b"\x1f\x8b":
            data = _inflate_arpa(data, path)
        buffer = np.frombuffer(data, dtype=np.uint8)
        return cls(_core.CoreModel.from_arpa_bytes(buffer, path, _vocab_list(vocab)))

    @classmethod
    def from_ngrams(
        cls,
        words: Sequence[str],
        tables: Sequence[NGramTable],
        vocab: Optional[Sequence[str]] = None,
    ) -> "NGramLM":
        """Compiles a model from n-gram tables (the layout :meth:`ngrams` returns).

        Model values follow :meth:`from_arpa`'s rules (``-inf`` log-probabilities become -99).

        Args:
            words: spelling of each word id used in the tables; must include ``<s>`` and
                ``</s>``.
            tables: ``tables[n - 1]`` is ``(ids, log10_prob, log10_backoff)`` for order n:
                ``ids`` int32 of shape ``(count, n)`` indexing ``words``, the two others
                float32 of shape ``(count,)``.
            vocab: as in :meth:`from_arpa`.

        Raises:
            ArpaFormatError: inconsistent tables (arrays of the wrong shape or dtype, ids
                outside ``words``, duplicates, words missing from unigrams, NaN, positive
                log-probabilities, infinite back-off weights); its path is ``"<tables>"``.
        """
        prepared = []
        for n, table in enumerate(tables, start=1):
            try:
                ids, prob, backoff = (np.asarray(x) for x in table)
            except (TypeError, ValueError) as exc:
                raise _table_error(f"order {n}: expected (ids, log10_prob, log10_backoff) arrays ({exc})") from exc
            if ids.size and not np.issubdtype(ids.dtype, np.integer):
                raise _table_error(f"order {n}: ids must be integers, got dtype {ids.dtype}")
            for name, x in (("log10_prob", prob), ("log10_backoff", backoff)):
                if x.size and not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
                    raise _table_error(f"order {n}: {name} must be real numbers, got dtype {x.dtype}")
            if ids.size % n or not (ids.size // n == prob.size == backoff.size):
                raise _table_error(f"order {n}: ids ({ids.shape}), log10_prob ({prob.shape}) and "
                                   f"log10_backoff ({backoff.shape}) do not describe the same n-grams")
            if ids.size and (ids.min() < 0 or ids.max() >= len(words)):
                raise _table_error(f"order {n}: word ids must index words (0..{len(words) - 1})")
            with np.errstate(over="ignore"):  # beyond float32 is inf, which the core judges
                prepared.append((np.ascontiguousarray(ids, dtype=np.int32).reshape(-1, n),
                                 np.ascontiguousarray(prob, dtype=np.float32).reshape(-1),
                                 np.ascontiguousarray(backoff, dtype=np.float32).reshape(-1)))
        core = _core.CoreModel.from_tables(list(words), prepared, _vocab_list(vocab), "<tables>")
        return cls(core)

    @classmethod
    def load(cls, path: "os.PathLike[str] | str") -> "NGramLM":
        """Memory-maps a binary model written by :meth:`save`, checking it completely.

        Raises:
            ModelFormatError: not a latticekit model, another version, truncated, corrupted,
                or holding a NaN or infinite value (the checksum guards against accidents,
                not against a crafted file: the values are checked too).
            FileAccessError: the file cannot be opened or mapped (an ``OSError``).
        """
        return cls(_core.CoreModel.load(path))

    def save(self, path: "os.PathLike[str] | str") -> None:
        """Writes the compact binary model (magic, version, checksum) atomically.

        The file is written in ``path``'s folder under a temporary name and renamed into
        place, so a crash never leaves a half-written model behind (see
        ``latticekit._files.atomic_write``: permission bits, symlinks, killed writers).

        Raises:
            FileAccessError: the file cannot be written (an ``OSError``).
        """
        with atomic_write(path) as f:
            self._core.write_image(f)

    # -- properties ------------------------------------------------------------------

    @property
    def order(self) -> int:
        """The model's order N (longest n-gram)."""
        return self._core.order

    @property
    def counts(self) -> Tuple[int, ...]:
        """Number of n-grams per order, ``counts[n - 1]`` for order n.

        Includes an added ``<unk>`` unigram when the source had none, and any missing
        n-gram prefixes filled in with their back-off probability.
        """
        return self._core.counts

    @property
    def num_ngrams(self) -> int:
        return sum(self.counts)

    @property
    def words(self) -> list[str]:
        """Spelling of each internal word id: ``<unk>``, ``<s>``, ``</s>``, then the rest."""
        if self._words is None:
            self._words = self._core.words()
        return list(self._words)

    def word_token_ids(self) -> np.ndarray:
        """The token id each internal word id spells, as the default (no ``vocab``) reading
        does: a canonical decimal integer (``"1234"``; not ``"007"``, ``"+7"`` or ``"²"``) is that
        token, every other word (``<unk>``, ``<s>``, ``</s>``, ...) is -1. int64, ``(num_words,)``."""
        return np.array([int(w) if w.isascii() and w.isdigit() and str(int(w)) == w else -1 for w in self.words],
                        dtype=np.int64)

    @property
    def size_bytes(self) -> int:
        """Size of the compiled model (the binary file's size)."""
        return self._core.size_bytes

    def __repr__(self) -> str:
        counts = ", ".join(f"{n}-grams={c}" for n, c in enumerate(self.counts, start=1))
        return f"NGramLM(order={self.order}, {counts})"

    # -- scoring ---------------------------------------------------------------------

    def token_logprobs(self, tokens: Any, context: Any = (), bos: bool = False) -> np.ndarray:
        """Natural-log probability of each token after ``context``.

        Args:
            tokens: token ids, shape ``(n,)`` (list, numpy array or torch tensor).
            context: the decoded prefix; only its last ``order - 1`` tokens matter.
            bos: start from ``<s>`` (KenLM's ``BeginSentenceWrite``) instead of the empty
                context (``NullContextWrite``).

        Returns:
            float64 array of shape ``(n,)``.

        Raises:
            VocabularyError: negative or out-of-range token ids.
        """
        return self._token_log10probs(tokens, context, bos) * LN10

    def score(self, tokens: Any, context: Any = (), bos: bool = False) -> float:
        """Natural-log probability of ``tokens`` after ``context`` (see :meth:`token_logprobs`).

        Equals KenLM's sum of ``BaseScore`` over the tokens, times ln 10.
        """
        # Summed in log10 and scaled once, as the search computes Path.lm_score.
        return float(self._token_log10probs(tokens, context, bos).sum()) * LN10

    def _token_log10probs(self, tokens: Any, context: Any, bos: bool) -> np.ndarray:
        return self._core.token_log10probs(token_array(tokens), token_array(context, "context"), bool(bos))

    def ngrams(self, order: int) -> NGramTable:
        """The n-grams of one order, in lexicographic order of word ids.

        Returns:
            ``(ids, log10_prob, log10_backoff)``: int32 of shape ``(count, order)`` indexing
            :attr:`words`, and two float32 arrays of shape ``(count,)``.

        Raises:
            LatticeError: order is not an integer in ``1..self.order``.
        """
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 1 <= order <= self.order:
            raise LatticeError(f"order must be in 1..{self.order}, got {order!r}")
        return self._core.ngrams(int(order))

    @classmethod
    def from_fst(cls, fst: Any, vocab: Optional[Sequence[str]] = None) -> "NGramLM":
        """Reads an OpenGrm n-gram model FST (``pywrapfst.Fst`` or a path to one).

        One state per history, back-off arcs on label 0, ``-ln`` tropical weights, ``</s>``
        as final weight, words from the FST's symbol table. Needs ``pynini``.
        """
        words, tables = tables_from_fst(fst)
        # from_ngrams takes back-off weight 0 where an n-gram opens no state (NaN here)
        return cls.from_ngrams(words, [(ids, prob, np.nan_to_num(backoff, nan=0.0)) for ids, prob, backoff in tables],
                               vocab)

    def to_fst(self) -> Any:
        """This model in the OpenGrm model format, a ``pywrapfst.VectorFst`` with symbol
        tables attached, that OpenFst and OpenGrm tools accept. Needs ``pynini``."""
        return ngramlm_to_fst(self)

    def write_arpa(self, path: "os.PathLike[str] | str") -> None:
        """Writes the model as an ARPA file (``.gz`` names are compressed), atomically."""
        write_arpa(os.fspath(path), self.words, [self.ngrams(n) for n in range(1, self.order + 1)])


# A gzip-compressed ARPA file is inflated only as far as its header allows: up to this much
# before the header is complete, then at most _BYTES_PER_FIELD per field of the n-grams it
# announces (a log-probability, n words, a back-off weight).
_MAX_PREAMBLE = 64 << 20
_BYTES_PER_FIELD = 1024
_GZIP_MAGIC = b"\x1f\x8b"


def _inflate_arpa(data: Union[bytes, bytearray, memoryview], path: str) -> bytearray:
    """The decompressed text of a gzip-compressed ARPA file (members concatenated), never
    inflated beyond what its header announces.

    Raises:
        ArpaFormatError: a corrupt or truncated gzip stream, or more text than the header allows.
    """
    out = bytearray()
    limit = None
    next_header_try = 0
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = memoryview(data)
    at = 0
    try:
        while True:
            piece = data[at:at + (1 << 16)]  # at most ~64 MiB of text per 64 KiB
            at += len(piece)
            out += stream.decompress(piece)
            if stream.eof:  # one gzip member ends; another may follow
                at -= len(stream.unused_data)
                if at == len(data):
                    break
                if bytes(data[at:at + 2]) != _GZIP_MAGIC:
                    raise ArpaFormatError(f"{path}: bytes after the gzip stream are not gzip data", path, 0)
                stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif at == len(data):
                raise ArpaFormatError(f"{path}: corrupt gzip stream: it ends early", path, 0)
            if limit is None and len(out) >= next_header_try:
                next_header_try = 2 * len(out)  # geometric: each byte is read O(1) times here
                header = _core.arpa_header(np.frombuffer(out, dtype=np.uint8), path)
                if header is not None:
                    counts, header_size = header
                    limit = header_size + _BYTES_PER_FIELD * sum(
                        count * (n + 2) for n, count in enumerate(counts, start=1))
                elif len(out) > _MAX_PREAMBLE:
                    raise ArpaFormatError(f"{path}: no complete \\data\\ header in the first "
                                          f"{_MAX_PREAMBLE >> 20} MiB of decompressed text", path, 0)
            if limit is not None and len(out) > limit:
                raise ArpaFormatError(f"{path}: decompresses to more than the {limit} bytes its header "
                                      f"allows (at most {_BYTES_PER_FIELD} per field of the n-grams it "
                                      "announces)", path, 0)
    except zlib.error as exc:
        raise ArpaFormatError(f"{path}: corrupt gzip stream: {exc}", path, 0) from exc
    return out


def _table_error(message: str) -> ArpaFormatError:
    return ArpaFormatError(f"<tables>: {message}", "<tables>", 0)


def _vocab_list(vocab: Optional[Sequence[str]]) -> Optional[list[str]]:
    if vocab is None:
        return None
    out = list(vocab)
    for i, word in enumerate(out):
        if not isinstance(word, str):
            raise TypeError(f"vocab[{i}] is {type(word).__name__}, expected str")
    return out
