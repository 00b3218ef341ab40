"""Training a patched model to its new context: what the fine-tune recipe (hf_posenc/recipes/finetune_*.py) is
made of (the factor search, which trains nothing, is hf_posenc/search/).

    positions.py       position schemes: the ids a short window trains at (PoSE, CREAM, randomized)
    data.py            the training text: documents loaded, packed into windows, collated
    losses.py          the objectives (cross-entropy, LongCE, distillation), a block of logits at a time
    s2_attention.py    LongLoRA's shifted sparse attention, in training mode only
    mixed_windows.py   windows inside the original context with the short rope, long ones with the long rope
    documents.py       packed documents kept apart (position ids restart, attention stays inside each)
    checkpoints.py     the run's checkpoints, loss log and resume, and the stop at a diverged loss
    trainable.py       what trains: parameter groups or regexes, LoRA adapters, dropout off for distillation, what
                       the objective never reaches frozen
    teacher.py         the model a distillation matches: the unpatched model or Self-Extend
    hardware.py        the attention implementation and the mixed precision the hardware runs

Nothing is imported here: `from hf_posenc.train import losses` loads what it names.
"""
