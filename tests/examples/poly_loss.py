"""Poly-1 (Leng et al., ICLR 2022, "PolyLoss"): each token's cross-entropy plus epsilon (1 - p), p the
probability the model gives the token; at epsilon 0, the cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from hf_posenc.config import Refused, check_number
from hf_posenc.train.losses import LossContract, TrainLoss, register_loss


@register_loss
@dataclass(frozen=True)
class Poly1(TrainLoss):
    """Poly-1: -log p + epsilon (1 - p) a token, p = exp(-cross-entropy)."""

    name: ClassVar[str] = "poly1"
    summary: ClassVar[str] = "Poly-1 (Leng et al. 2022): each token's cross-entropy + epsilon (1 - p)"
    contract: ClassVar[LossContract] = LossContract(   # what the suite runs it with (docs/ARCHITECTURE.md)
        examples=({"epsilon": 1.0}, {"epsilon": -1.0}),
        plain={"epsilon": 0.0},
        refused=(Refused({"epsilon": -2.0}, "epsilon must be >= -1"),),
    )

    epsilon: float = 1.0

    def __post_init__(self) -> None:
        # below -1 the loss would grow as p nears 1: the model would learn to doubt the right token
        check_number("epsilon", self.epsilon, minimum=-1, optional=False)

    def token_losses(self, losses: torch.Tensor) -> torch.Tensor:
        return losses + self.epsilon * (1 - torch.exp(-losses))
