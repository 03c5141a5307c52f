"""How the search's time depends on what the caches still hold.

The same n benchmark lattices (8 x 16 by default, as in rescore_latency.py) are searched in
rotation, over and over, for n from 1 (everything the search reads stays cached) to 400
(every lattice cold, as in rescore_latency.py). Reported: thread CPU time per lattice,
the median of 7 passes over 400 searches, averaged over 4 different sets of n lattices.
The step between n = 2 and n = 16 is where the lattices' model lines stop fitting the L2
and L3 (see docs/design.md, "Where the time goes"; benchmarks/memory_latency.c measures the
machine itself).

    python benchmarks/cache_rotation.py                     # 8 x 16, p = 1
    python benchmarks/cache_rotation.py --shape 8,16,16     # h, k, p
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import latticekit as lk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rescore_latency import GOLDEN, make_lattices, read_stream  # noqa: E402

ROTATIONS = (1, 2, 3, 4, 6, 8, 16, 32, 64, 400)
SEARCHES = 400


def per_lattice_ms(lattices, lm, p: int) -> float:
    rotation = lattices * (SEARCHES // len(lattices))
    # One batched lattice, stacked once, so that the passes time the search alone.
    batch = lk.SausageLattice(np.stack([lat.tokens for lat in rotation]),
                              np.stack([lat.scores for lat in rotation]))
    lk.pbest_batch(batch, lm, p, 1.0, bos=True, threads=1)  # warm-up pass
    times = []
    for _ in range(7):
        t = time.thread_time()
        lk.pbest_batch(batch, lm, p, 1.0, bos=True, threads=1)
        times.append(time.thread_time() - t)
    return statistics.median(times) / len(rotation) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(GOLDEN / "katz4.arpa.gz"),
                    help="an ARPA file or a compiled model (.lkm)")
    ap.add_argument("--heldout", default=str(GOLDEN / "heldout_ids.txt.gz"))
    ap.add_argument("--shape", default="8,16,1", help="h,k,p")
    args = ap.parse_args(argv)
    h, k, p = (int(x) for x in args.shape.split(","))

    model = Path(args.model)
    lm = lk.NGramLM.load(model) if model.suffix == ".lkm" else lk.NGramLM.from_arpa(model)
    stream = read_stream(args.heldout)
    lattices = [lat for lat, _ in make_lattices(lm, stream, SEARCHES, h, k, seed=h * 100 + k)]

    print(f"{h} x {k}, p={p}: thread CPU ms per lattice, n lattices in rotation")
    print(f"{'n':>5} {'ms':>8}")
    for n in ROTATIONS:
        starts = range(0, 4 * 10, 10) if n < SEARCHES else [0]
        ms = np.mean([per_lattice_ms(lattices[s:s + n], lm, p) for s in starts])
        print(f"{n:>5} {ms:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
