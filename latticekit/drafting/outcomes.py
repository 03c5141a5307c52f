"""What ``auto``'s arms brought, kept from one call to the next.

``auto`` (:mod:`latticekit.drafting.drafters.auto`) chooses every step which sources to read
(its *arms*: with heads, the union of heads and text, and the text alone) from what each really
brought: decayed sums of the tokens it emitted and the seconds it cost, the union's advantage
over the text alone on the same positions, and when to probe an arm that is not the best. A
drafter that starts from nothing tries every arm twice and probes the losers after 2, 4, 8, ...
steps: a short request pays that whole exploration. :class:`ArmOutcomes` is that state as
plain data; an :class:`ArmStore` keeps it per key (the model, its device and threads, the heads,
the drafter: :func:`outcomes_key`), in this process and, given a folder, in a small JSON file
per key written whole (a temporary file renamed over it), so the next call, or the next
process, starts from where the last one stopped. A damaged, foreign or older file is ignored
(the call starts from nothing, and its end replaces the file).

Plain Python; nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from latticekit._files import atomic_write
from latticekit.errors import DecoderConfigError, FileAccessError

__all__ = ["OUTCOMES_VERSION", "ArmRecord", "ArmOutcomes", "ArmStore", "outcomes_key"]

#: Bumped when what an arm keeps, or what it means, changes: older files are ignored.
OUTCOMES_VERSION = 1
_PREFIX = "arms-"


@dataclass(frozen=True)
class ArmRecord:
    """One arm's outcomes as plain data: what :meth:`ArmStats.record
    <latticekit.drafting.arms.ArmStats.record>` gives and :meth:`ArmStats.from_record
    <latticekit.drafting.arms.ArmStats.from_record>` reads.

    Attributes:
        tokens, seconds: the tokens it emitted and the seconds it cost, decayed per step.
        steps: the steps it was read (an arm read fewer than twice is tried first).
        since: decode steps since it was last read.
        interval: the steps after which it is probed when it is not the best.
    """

    tokens: float
    seconds: float
    steps: int
    since: int
    interval: int


@dataclass(frozen=True)
class ArmOutcomes:
    """``auto``'s arm choice state between calls.

    Attributes:
        arms: each arm's :class:`ArmRecord`, by name.
        paired: the union's tokens and seconds and the text alone's tokens and seconds on the
            union's steps, decayed (zeros without a union).
    """

    arms: dict[str, ArmRecord]
    paired: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"version": OUTCOMES_VERSION,
                "arms": {name: [r.tokens, r.seconds, r.steps, r.since, r.interval] for name, r in self.arms.items()},
                "paired": list(self.paired)}

    @classmethod
    def from_json(cls, data: Any) -> "ArmOutcomes":
        """Raises:
            DecoderConfigError: another version, or not what :meth:`to_json` writes (a
                negative or non-finite figure, an interval under 1, ...)."""
        if not isinstance(data, dict) or data.get("version") != OUTCOMES_VERSION:
            raise DecoderConfigError(f"arm outcomes must be a dict of version {OUTCOMES_VERSION}")
        arms, paired = data.get("arms"), data.get("paired")
        if not isinstance(arms, dict) or not arms or not isinstance(paired, list) or len(paired) != 4:
            raise DecoderConfigError("arm outcomes need arms and four paired sums")
        records = {}
        for name, row in arms.items():
            if not isinstance(row, list) or len(row) != 5 or not all(_figure(x) for x in row) \
                    or not all(isinstance(x, int) for x in row[2:]) or row[4] < 1:
                raise DecoderConfigError(f"arm {name!r}: bad outcomes {row!r}")
            records[str(name)] = ArmRecord(float(row[0]), float(row[1]), *row[2:])
        if not all(_figure(x) for x in paired):
            raise DecoderConfigError(f"bad paired sums {paired!r}")
        return cls(records, tuple(float(x) for x in paired))  # type: ignore[arg-type]


def _figure(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def outcomes_key(**parts: Any) -> str:
    """A short key for what the outcomes depend on (``parts``: JSON-able values, e.g. the
    model's description, the heads' fingerprint, the drafter's arms)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ArmStore:
    """Arm outcomes per key, in this process and, given ``folder``, on disk
    (``<folder>/arms-<key>.json``).

    Args:
        folder: where the files live; None keeps the outcomes in this process only.
    """

    def __init__(self, folder: Union[str, Path, None] = None) -> None:
        self.folder = None if folder is None else Path(folder)
        self._kept: dict[str, ArmOutcomes] = {}
        self._lock = threading.Lock()

    def path(self, key: str) -> Optional[Path]:
        """The file of ``key``, or None without a folder."""
        return None if self.folder is None else self.folder / f"{_PREFIX}{key}.json"

    def get(self, key: str) -> Optional[ArmOutcomes]:
        """The outcomes kept for ``key``: this process's, else its file's; None when there are
        none or the file is unreadable, damaged or of another version."""
        with self._lock:
            kept = self._kept.get(key)
        path = self.path(key)
        if kept is not None or path is None:
            return kept
        try:
            kept = ArmOutcomes.from_json(json.loads(path.read_bytes()))
        except (OSError, ValueError, DecoderConfigError):  # missing, damaged, older: start afresh
            return None
        with self._lock:
            return self._kept.setdefault(key, kept)

    def put(self, key: str, outcomes: ArmOutcomes) -> None:
        """Keeps ``outcomes`` for ``key``, and writes its file where there is a folder (a folder
        that cannot be written keeps them in this process only)."""
        with self._lock:
            self._kept[key] = outcomes
        path = self.path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(path) as f:
                f.write((json.dumps(outcomes.to_json()) + "\n").encode())
        except (OSError, FileAccessError):
            pass

    def clear(self) -> None:
        """Forgets every key: this process's outcomes and the folder's files."""
        with self._lock:
            self._kept.clear()
        if self.folder is None:
            return
        for path in self.folder.glob(f"{_PREFIX}*.json"):
            try:
                path.unlink()
            except OSError:
                pass
