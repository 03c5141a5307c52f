"""One call from a corpus to a Katz back-off model: count, cut, estimate, prune, extend."""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from latticekit.errors import VocabularyError
from latticekit.lm.corpus import (
    DEFAULT_CHUNK_TOKENS,
    TokenIdTable,
    WordTable,
    array_chunks,
    load_tokenizer,
    text_chunks,
    token_id_chunks,
    tokenizer_chunks,
)
from latticekit.lm.counting import DEFAULT_RUN_MEMORY, NGramCounts, count_corpus
from latticekit.lm.katz import estimate_katz
from latticekit.lm.model import BackoffModel

__all__ = ["count_ngrams", "build_katz", "add_unseen_vocabulary", "UNSEEN_LOG10_PROB"]

#: log10 probability given to vocabulary entries the corpus lacks (``add_unseen_vocabulary``).
UNSEEN_LOG10_PROB = -1000.0


def count_ngrams(
    inputs: Union[Sequence[str], Iterable[np.ndarray]],
    order: int,
    *,
    tokenized: bool = False,
    tokenizer: Optional[Union[str, Any]] = None,
    vocab_size: Optional[int] = None,
    workers: int = 2,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    spill_dir: Optional[str] = None,
    progress: Optional[Any] = None,
    run_memory: int = DEFAULT_RUN_MEMORY,
    min_counts: Optional[Sequence[int]] = None,
) -> "tuple[NGramCounts, List[str]]":
    """Count the n-grams of a corpus.

    Args:
        inputs: file paths, or (when neither ``tokenized`` nor ``tokenizer`` applies and the
            items are arrays) numpy arrays of token ids, one per sentence.
        order: highest order (>= 1).
        tokenized: files hold decimal token ids, one sentence per line.
        tokenizer: a tokenizer (path to ``tokenizer.json`` or a transformers directory, or a
            loaded object with ``encode_batch``) to encode raw text files.
        vocab_size: token ids must be below it (token-id inputs).
        workers: counting threads.
        chunk_tokens: words per counted chunk (bounds memory).
        spill_dir: where sorted runs are spilled (temporary directory by default).
        progress: optional ``update(n)`` sink, e.g. a tqdm bar counting stream ids.
        run_memory: bytes of count runs held in memory before they are merged and spilled
            to ``spill_dir`` (see :func:`~latticekit.lm.counting.count_corpus`).
        min_counts: per-order minimum counts applied while merging the runs (same result as
            :meth:`NGramCounts.prune_min_counts` afterwards, without holding the unpruned
            tables).

    Returns:
        (count tables, word table).

    Raises:
        ValueError: if ``order`` < 1 or a minimum count is < 1.
        CorpusError: empty corpus, undecodable text, malformed id lines.
        VocabularyError: token ids outside the vocabulary.
    """
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    items: Sequence[Any] = list(inputs) if not isinstance(inputs, (list, tuple)) else inputs
    table: Union[WordTable, TokenIdTable]
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        table = TokenIdTable(vocab_size or getattr(tok, "vocab_size", None))
        chunks = tokenizer_chunks(items, tok, table, chunk_tokens)
    elif tokenized:
        table = TokenIdTable(vocab_size)
        chunks = token_id_chunks(items, table, chunk_tokens)
    elif items and not isinstance(items[0], str):
        table = TokenIdTable(vocab_size)
        chunks = array_chunks(items, table, chunk_tokens)
    else:
        table = WordTable()
        chunks = text_chunks(items, table, chunk_tokens)
    counts = count_corpus(
        chunks,
        order,
        3,
        workers=workers,
        spill_dir=spill_dir,
        progress=progress,
        run_memory=run_memory,
        min_counts=min_counts,
    )
    return counts, table.words


def add_unseen_vocabulary(
    model: BackoffModel, vocab_size: int, log10_prob: float = UNSEEN_LOG10_PROB
) -> BackoffModel:
    """Add every token id of ``[0, vocab_size)`` the model lacks as a unigram.

    What the reference paper does so that every lattice path keeps a finite score: the
    new unigrams get ``log10_prob`` (-1000) and no back-off state. The model must have
    decimal token-id words.

    Args:
        model: a model over token ids.
        vocab_size: the target model's vocabulary size.
        log10_prob: log10 probability of the added unigrams.

    Returns:
        A new model with the extra unigrams.

    Raises:
        VocabularyError: if a (non-special) word of the model is not a decimal token id or is
            beyond ``vocab_size``.
    """
    words = list(model.words)
    try:
        present = np.array([int(w) for w in words[3:]], dtype=np.int64)
    except ValueError as exc:
        raise VocabularyError("the model's words are not token ids; cannot add a vocabulary") from exc
    if len(present) and present.max() >= vocab_size:
        raise VocabularyError(f"model has token id {int(present.max())} beyond vocab_size {vocab_size}")
    has = np.zeros(vocab_size, bool)
    # a word may be in the table without a unigram (e.g. after pruning): check the table rows
    unigram_words = np.asarray(model.word[0])
    token_rows = unigram_words[unigram_words >= 3]
    has[present[token_rows - 3]] = True
    missing = np.flatnonzero(~has)
    index = {int(t): i + 3 for i, t in enumerate(present)}
    new_ids = np.empty(len(missing), np.int64)
    for j, t in enumerate(missing.tolist()):  # once per missing vocabulary entry, not per token
        i = index.get(t)
        if i is None:
            i = len(words)
            words.append(str(t))
        new_ids[j] = i
    out = model.copy()
    out.words = words
    out.vocab_size = max(model.vocab_size, len(words))
    old_keys = np.asarray(model.word[0], np.int64)
    all_words = np.concatenate([old_keys, new_ids])
    order = np.argsort(all_words, kind="stable")
    new_row_of_old = np.empty(len(all_words), np.int64)
    new_row_of_old[order] = np.arange(len(all_words))
    out.prefix[0] = np.zeros(len(all_words), np.int64)
    out.word[0] = all_words[order].astype(np.int32)
    out.log10_prob[0] = np.concatenate([model.log10_prob[0], np.full(len(new_ids), log10_prob)])[order]
    out.log10_backoff[0] = np.concatenate([model.log10_backoff[0], np.full(len(new_ids), np.nan)])[order]
    if out.order >= 2:
        out.prefix[1] = new_row_of_old[: len(old_keys)][np.asarray(model.prefix[1])]
    # re-key higher tables with the (possibly larger) vocabulary: prefixes are rows, unchanged
    return out


def build_katz(
    inputs: Union[Sequence[str], Iterable[np.ndarray]],
    order: int,
    *,
    tokenized: bool = False,
    tokenizer: Optional[Union[str, Any]] = None,
    vocab_size: Optional[int] = None,
    min_counts: Optional[Sequence[int]] = None,
    theta: Optional[float] = None,
    target_ngrams: Optional[int] = None,
    add_vocabulary: bool = False,
    workers: int = 2,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    spill_dir: Optional[str] = None,
    progress: Optional[Any] = None,
    run_memory: int = DEFAULT_RUN_MEMORY,
) -> BackoffModel:
    """Build a Katz back-off model from a corpus, as OpenGrm would.

    Args:
        inputs: see :func:`count_ngrams`.
        order: highest n-gram order.
        tokenized: see :func:`count_ngrams`.
        tokenizer: see :func:`count_ngrams`.
        vocab_size: vocabulary size of token ids (bounds checks and ``add_vocabulary``).
        min_counts: per-order minimum counts applied before estimation (e.g. ``1, 1, 2, 4``).
        theta: relative-entropy pruning threshold (OpenGrm ``ngramshrink``).
        target_ngrams: prune to at most this many n-grams instead of by ``theta``.
        add_vocabulary: add every id of ``[0, vocab_size)`` the corpus lacks as a unigram
            with log10 probability -1000.
        workers: counting threads.
        chunk_tokens: words per counted chunk.
        spill_dir: where count runs are spilled.
        progress: optional ``update(n)`` sink.
        run_memory: bytes of count runs held in memory before spilling (see
            :func:`count_ngrams`).

    Returns:
        The model (``model.discounts`` holds the Katz discount table).

    Raises:
        ValueError: bad order/min counts/pruning options.
        CorpusError, VocabularyError: bad input.
    """
    if add_vocabulary and vocab_size is None:
        if tokenizer is None:
            raise ValueError("add_vocabulary needs vocab_size (or a tokenizer)")
    counts, words = count_ngrams(
        inputs,
        order,
        tokenized=tokenized,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        workers=workers,
        chunk_tokens=chunk_tokens,
        spill_dir=spill_dir,
        progress=progress,
        run_memory=run_memory,
        min_counts=min_counts,
    )
    model = estimate_katz(counts, words)
    if theta is not None or target_ngrams is not None:
        from latticekit.lm.prune import prune_relative_entropy

        model = prune_relative_entropy(model, theta=theta, target_ngrams=target_ngrams)
    if add_vocabulary:
        if vocab_size is None:
            tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
            assert tok is not None  # checked on entry: add_vocabulary without vocab_size needs a tokenizer
            vocab_size = int(tok.vocab_size)
        discounts = getattr(model, "discounts", None)
        model = add_unseen_vocabulary(model, vocab_size)
        model.discounts = discounts  # type: ignore[attr-defined]
    return model
