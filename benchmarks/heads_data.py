"""Cache SmolLM2-135M-Instruct's hidden states and greedy labels for head training: the data half
of the heads recipe, :mod:`latticekit.heads.data` (its docstring says what and how).

Usage::

    PYTHONPATH=. python benchmarks/heads_data.py [--train-tokens 1000000] [--threads 2]
"""

from latticekit.heads.data import main

if __name__ == "__main__":
    main()
