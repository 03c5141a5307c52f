"""Train draft heads on the cached data: the training half of the heads recipe,
:mod:`latticekit.heads.recipe` (its docstring says what and how).

Usage::

    PYTHONPATH=. python benchmarks/train_heads.py --name mlp1 [--layer medusa --num-layers 2] \\
        [--out latticekit/data/heads/smollm2-135m-h8-v2.safetensors]
"""

from latticekit.heads.recipe import main

if __name__ == "__main__":
    main()
