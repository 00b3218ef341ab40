"""Fine-tune a patched model (the recipe lives in hf_posenc/recipes/finetune.py, so an installed package
runs it too: `accelerate launch -m hf_posenc.recipes.finetune ...` or `hf-posenc finetune ...`).

    accelerate launch recipes/finetune.py --config recipes/configs/smollm2_yarn_16k_finetune.yaml
"""

import sys

from hf_posenc.recipes.finetune import cli

if __name__ == "__main__":
    sys.exit(cli())
