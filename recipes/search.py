"""Search RoPE's per-pair factors for a longer context (the recipe lives in hf_posenc/recipes/search.py, so an
installed package runs it too: `python -m hf_posenc.recipes.search ...` or `hf-posenc search ...`).

    python recipes/search.py --config recipes/configs/smollm2_search_16k.yaml
"""

from hf_posenc.recipes.search import main

if __name__ == "__main__":
    main()
