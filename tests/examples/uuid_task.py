"""RULER's niah_single_3 (Hsieh et al. 2024): one UUID for a key word, hidden in real text; the probe asks for it."""

from __future__ import annotations

import random
import uuid

from hf_posenc.eval.ruler import KEYS, TaskFamily, register_task


@register_task
class Uuid(TaskFamily):
    """niah_single_3: a 36-character UUID instead of single's 7-digit number, so the answer is many tokens."""

    name = "uuid"
    ruler = "niah_single_3"
    summary = "one UUID for a key word in real text; asks that UUID"
    reads = ("depths",)   # one needle: it sits at the sample's depth

    def content(self, rng: random.Random, needles: int, hops: int) -> tuple[list[str], list[tuple[str, str]]]:
        key = rng.choice(KEYS)
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))   # from rng alone: the seed gives the sample
        needle = f"One of the special magic uuids for {key} is: {value}.\n"
        question = (f"What is the special magic uuid for {key} mentioned in the provided text? The special magic "
                    f"uuid for {key} mentioned in the provided text is")
        return [needle], [(question, f" {value}")]
