"""The interface fit's predictors meet: each module (`roofline_predict`, `kernel_predict`) calibrates on a
store's measurements, predicts a model it was never measured on (a point, the interval it lies in where the
predictor gives one, what the prediction rests on) and holds out each measured model to say how far to
trust it. fit asks them in turn; the verdict, the budgets and the records stay fit's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .fit_result import CvPoint
from .model_counts import ModelCounts

# What a prediction is of: "latency_ms:<stat>" (p50, p99, min = the fastest inference), "memory_mb" (the
# model's own memory), "energy_mj" (per inference).
LATENCY = "latency_ms"
MEMORY = "memory_mb"
ENERGY = "energy_mj"


@dataclass(frozen=True)
class Prediction:
    """One predicted quantity: the point, the interval the true value lies in at the predictor's coverage
    (None: the predictor gives none), and what it rests on."""

    point: float
    interval: tuple[float, float] | None = None
    evidence: str = ""


class Predictor(Protocol):
    """A calibrated predictor of one store's targets (device, runtime)."""

    name: str

    def predict(
        self, target: tuple[str, str | None], model: str, counts: ModelCounts, stats: Sequence[str]
    ) -> dict[str, Prediction] | None:
        """The model's predicted quantities on the target, by quantity ("latency_ms:p50" always, the other
        latency `stats` asked where the predictor gives them); None where it cannot predict there."""
        ...

    def held_out(self) -> list[CvPoint]:
        """Each measured model predicted by a calibration that never saw it, its `predictor` this name."""
        ...
