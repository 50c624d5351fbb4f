"""Early stopping: end training once a validation metric has stopped improving."""

from __future__ import annotations

from typing import Optional

# config name -> (key in the validation metrics, whether higher is better, how to say it)
_METRICS = {"bleu": ("valid_bleu", True, "BLEU"), "loss": ("valid_loss", False, "loss")}


class EarlyStopping:
    """Counts validations since `metric` last improved; `patience` of them in a row mean stop."""

    def __init__(self, metric: str, patience: int):
        self.metric = metric
        self.key, self.higher_is_better, self.label = _METRICS[metric]
        self.patience = patience
        self.best: Optional[float] = None
        self.best_step = 0
        self.stale = 0  # validations since the best one

    def update(self, metrics: dict) -> bool:
        """Record one validation; True when training should stop."""
        value = metrics.get(self.key)
        if value is None:  # no validation split, so nothing to judge by
            return False
        if self.best is None or (value > self.best if self.higher_is_better else value < self.best):
            self.best, self.best_step, self.stale = value, metrics["step"], 0
        else:
            self.stale += 1
        return self.stale >= self.patience

    def reason(self) -> str:
        return (
            f"early stopping: validation {self.label} has not improved for {self.stale} validations "
            f"(train.early_stopping.patience={self.patience}); the best, {self.best:.3f}, was at step "
            f"{self.best_step:,}"
        )

    def state_dict(self) -> dict:
        return {"metric": self.metric, "best": self.best, "best_step": self.best_step, "stale": self.stale}

    def load_state_dict(self, state: dict) -> None:
        if state.get("metric") == self.metric:  # a resumed run that switched metric starts counting afresh
            self.best, self.best_step, self.stale = state["best"], state["best_step"], state["stale"]
