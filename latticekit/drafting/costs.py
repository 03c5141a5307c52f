"""What a decoding step costs: the target call's seconds as a function of the draft tree.

:class:`StepCosts` is the table a cost-aware drafter weighs trees with; it is measured on the
device by :func:`latticekit.decoding.costs.step_costs` (torch), or given (replays, tests, an
engine that measures its own steps). Plain Python; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from latticekit.errors import DecoderConfigError

__all__ = ["COSTS_VERSION", "StepCosts", "monotone"]

#: Bumped when what is measured, or how, changes: older cache files are measured again (the
#: version is part of a cache file's name and checked when one is read). 3: the probe times
#: steady state (version 2 timed a growing cache, every call's key length new: under cuDNN's
#: per-length attention plans it measured 2-5x the true step).
COSTS_VERSION = 3


@dataclass
class StepCosts:
    """Seconds per target call against the number of draft-tree nodes it verifies.

    Attributes:
        nodes: the measured tree sizes, increasing; 0 is a plain one-token step.
        seconds: median seconds of a target call at each size, at ``prefix_tokens`` cached tokens.
        prefix_tokens: cached tokens during the measurement.
        row_token_s: extra seconds per pass row and cached token beyond ``prefix_tokens``
            (attention reads every cached key for every row); 0 when not measured.
        draft_s: seconds a drafting step spends searching its candidates, when fixed in advance
            (replays, tests); None: the drafter measures its own as it runs.
        heads_s: seconds reading the heads' lattice adds to a drafting step (the heads forward,
            their projection), when fixed in advance (tests); None: the loop's measure of each
            lattice it builds (a replay's: the trace's heads seconds per position).
        description: what was measured (model, device, threads, torch version, when).
    """

    nodes: list[int]
    seconds: list[float]
    prefix_tokens: int
    row_token_s: float = 0.0
    draft_s: Optional[float] = None
    description: dict[str, Any] = field(default_factory=dict)
    heads_s: Optional[float] = None

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.seconds) or len(self.nodes) < 2 or self.nodes[0] != 0 \
                or any(b <= a for a, b in zip(self.nodes, self.nodes[1:])):
            raise DecoderConfigError("step costs need increasing tree sizes from 0, one time each")

    def target_s(self, nodes: int, cached: Optional[int] = None) -> float:
        """Predicted seconds of a target call verifying ``nodes`` tree nodes (0: a plain step)
        over ``cached`` cached tokens (default: as measured). Linear between measured sizes and
        beyond the largest."""
        xs, ys = self.nodes, self.seconds
        if nodes <= xs[-1]:
            i = max(1, next(j for j, x in enumerate(xs) if x >= nodes))
        else:
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        base = y0 + (y1 - y0) * (nodes - x0) / (x1 - x0)
        if cached is not None:
            base += self.row_token_s * (nodes + 1) * (cached - self.prefix_tokens)
        return max(base, 1e-9)

    def to_json(self) -> dict[str, Any]:
        return {"version": COSTS_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StepCosts":
        if data.get("version") != COSTS_VERSION:
            raise DecoderConfigError(f"step costs of version {data.get('version')!r}, expected {COSTS_VERSION}")
        draft_s, heads_s = data.get("draft_s"), data.get("heads_s")
        return cls([int(n) for n in data["nodes"]], [float(s) for s in data["seconds"]], int(data["prefix_tokens"]),
                   float(data.get("row_token_s", 0.0)), None if draft_s is None else float(draft_s),
                   dict(data.get("description", {})), None if heads_s is None else float(heads_s))


def monotone(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent
    violators): a bigger tree never costs less, whatever noise one timing caught."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out: list[float] = []
    for total, count in blocks:
        out += [total / count] * int(count)
    return out
