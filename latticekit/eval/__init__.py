"""The paper's evaluation harness: ``latticekit eval`` (:mod:`~latticekit.eval.evaluate`), its
prompts, model loading, reports and analyses, replays of greedy traces
(:mod:`~latticekit.eval.replay`: every greedy decoder's steps without a target call, through
the same loop as a decode), and the neural rescorer with its ``neural`` drafter, registered here.

The analyses and reports read saved records with numpy alone; torch is imported where a model runs.
"""

from latticekit.eval import neural  # noqa: F401  (registers the ``neural`` method)
