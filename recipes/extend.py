"""Extend a RoPE checkpoint's context in one command: plan, search, fine-tune, judge, export (the recipe lives in
hf_posenc/recipes/extend.py, so an installed package runs it too: `hf-posenc extend ...`).

    python recipes/extend.py --model smollm2 --target 32768
"""

from hf_posenc.recipes.extend import main

if __name__ == "__main__":
    main()
