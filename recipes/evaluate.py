"""Evaluate positional variants (the recipe lives in hf_posenc/recipes/evaluate.py, so an installed
package runs it too: `python -m hf_posenc.recipes.evaluate ...` or `hf-posenc evaluate ...`).

    python recipes/evaluate.py --config recipes/configs/eval_smollm2_cpu.yaml
"""

from hf_posenc.recipes.evaluate import main

if __name__ == "__main__":
    main()
