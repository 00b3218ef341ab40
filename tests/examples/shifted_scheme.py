"""The worked example of docs/ARCHITECTURE.md, "Position schemes": a scheme as a contributor adds one to
hf_posenc/train/positions.py (there the imports below are already at the top of the file). tests/conftest.py imports
tests/examples, which registers it in the test process only, so the scheme contract (tests/test_positions.py)
runs on it exactly as on the shipped schemes; hf_posenc never imports it.

SHAPE (Kiyono et al., EMNLP 2021, "Shifted Absolute Position Embedding"): in training, every position of a
sequence is shifted by one offset k drawn uniformly from [0, K]. Here K is `max_shift`, capped so the last id
stays below the target. The distances between tokens stay those of 0..n-1, which the model card then says
(it reads them from the ids drawn): with RoPE, which sees only distances, the shift teaches nothing new;
it is the shortest scheme with a parameter, not a way to train long on short."""

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from hf_posenc.config import MAX_POSITIONS, check_number
from hf_posenc.train.positions import PositionScheme, register_scheme


@register_scheme
@dataclass(frozen=True)
class Shifted(PositionScheme):
    """SHAPE: the ids 0..n-1 shifted by one offset per window, uniform in [0, min(max_shift, target - n)]."""

    name: ClassVar[str] = "shifted"
    summary: ClassVar[str] = "SHAPE (Kiyono et al. 2021): 0..n-1 shifted by one random offset"
    reaches_target: ClassVar[bool] = False   # the distances stay 1..n-1 whatever the target

    max_shift: Optional[int] = None          # K; None: as far as the target allows

    def __post_init__(self) -> None:
        super().__post_init__()               # target, contiguous_share, text
        check_number("max_shift", self.max_shift, minimum=0, maximum=MAX_POSITIONS, integer=True)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        room = self.target - n                # check_window has made sure n <= target
        shift = room if self.max_shift is None else min(self.max_shift, room)
        return np.arange(n) + rng.integers(0, shift + 1)
