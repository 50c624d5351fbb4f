"""The training loop, run on what `setup_training` (setup.py) built: updates over each epoch's
batches, periodic validation (loss and BLEU), atomic checkpoints, and stopping on the budget, a
signal, divergence or early stopping."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from attn_cli.checkpoint import keep_newest_step_checkpoints, save_checkpoint
from attn_cli.config import Config
from attn_cli.data.batching import token_batches
from attn_cli.data.casing import CasingSettings, case_epoch
from attn_cli.data.collate import Batch, collate
from attn_cli.data.joining import JoinSettings, join_epoch
from attn_cli.data.weighting import draw_epoch
from attn_cli.decoding.pipeline import translate
from attn_cli.decoding.records import Source
from attn_cli.decoding.scoring import score_translations
from attn_cli.engines.pytorch import TorchEngine
from attn_cli.languages import joiner
from attn_cli.paths import RunPaths
from attn_cli.training.distributed import process_group
from attn_cli.training.guards import StopRequest, TrainingInterrupted, run_directory_lock, stop_requests
from attn_cli.training.loss import label_smoothed_loss
from attn_cli.training.memory import (
    TrainingOutOfMemory,
    describe_batches,
    is_out_of_memory,
    out_of_memory_message,
)
from attn_cli.training.progress import MetricsLog, TrainingDisplay, TrainingStatus
from attn_cli.training.setup import TrainingSetup, setup_training
from attn_cli.training.state import best_metric, capture_rng_state
from attn_cli.training.step import StepResult, TrainingDiverged


@dataclass
class TrainResult:
    """How a finished run ended, for the command's closing line."""

    step: int
    epoch: int
    elapsed: float  # seconds in the training loop, those before a resume included
    best_metrics: dict
    paths: RunPaths


class Trainer:
    """The loop over a run's updates, from what `setup_training` built: validation, checkpoints and
    stopping. With several processes (`ranks`), every process makes one Trainer; rank 0 alone writes
    files and validates, and they agree on every decision to stop."""

    def __init__(self, setup: TrainingSetup):
        """Takes the setup as it is; `run` starts the loop."""
        self.setup = setup
        self.state = setup.state  # where the run stands: written into every checkpoint
        self.best_metric = best_metric(setup.cfg.train)  # what decides best.pt and early stopping
        self.stop_early = False  # set by a validation that used up the early-stopping patience
        self._epoch_batches: tuple[int, list[list[int]]] = (0, [])
        self._epoch_examples = setup.train_examples  # the examples _epoch_batches' positions point into

    # -- one step -------------------------------------------------------------------------------

    def train_step(self, batches: list[Batch]) -> StepResult:
        """One update; a non-finite loss or gradient norm skips it (and counts towards stopping),
        leaving `step` as it was.
        An update that runs out of memory raises TrainingOutOfMemory naming its batches."""
        failed = None
        try:
            result = self.setup.update(batches)
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            failed = describe_batches(batches)
        if failed is not None:
            # Raised outside the except block: the allocator's error, whose traceback holds the failed
            # step's tensors, is gone, and with it the memory the checkpoint about to be saved may need.
            raise TrainingOutOfMemory(failed)
        if not result.applied:
            self.state.nonfinite_steps += 1
        self.setup.nonfinite.record(result, self.state.step)
        if result.applied:
            self.state.step += 1
        return result

    # -- validation and checkpoints -------------------------------------------------------------

    @torch.inference_mode()
    def validation_loss(self) -> float:
        """Mean per-token negative log-likelihood on the validation split, without smoothing."""
        self.setup.model.eval()
        total, tokens = 0.0, 0
        for positions in token_batches(self.setup.valid_examples, self.setup.cfg.train.max_tokens, shuffle=False):
            batch = collate([self.setup.valid_examples[p] for p in positions]).to(self.setup.device)
            with self.setup.precision.autocast(self.setup.device):
                logits = self.setup.model(batch.src, batch.tgt_in)
            loss_sum, count = label_smoothed_loss(logits, batch.tgt_out, 0.0)
            total, tokens = total + loss_sum.item(), tokens + count
        return total / max(tokens, 1)

    def validation_bleu(self) -> dict[str, float]:
        """Corpus BLEU of the model's translations of the validation sources, decoded as cfg.decode
        says, in each direction (scored as its target language asks), and their mean ("all")."""
        self.setup.model.eval()
        held_out = [(direction, pairs) for direction, pairs in self.setup.valid_pairs.items() if pairs]
        sources = [Source(pair[0], target=direction.target) for direction, pairs in held_out for pair in pairs]
        with self.setup.precision.autocast(self.setup.device):
            translations = translate(
                TorchEngine([self.setup.model], self.setup.tokenizers, [self.setup.cfg]), sources, self.setup.cfg.decode
            )
        scores, start = {}, 0
        for direction, pairs in held_out:
            hypotheses = [translation.text for translation in translations[start : start + len(pairs)]]
            start += len(pairs)
            scores[str(direction)] = score_translations(hypotheses, [p[1] for p in pairs], direction.target)[0].score
        return {"all": sum(scores.values()) / max(len(scores), 1), **(scores if len(scores) > 1 else {})}

    def validate_and_save(self) -> None:
        """Validation and checkpoints on rank 0 while the other processes wait; every process learns
        whether early stopping ends the run."""
        if not self.setup.ranks.is_main:
            self.state.validated_step = self.state.step
            self._save([], {})
            self.stop_early = self.setup.ranks.from_main(False)
            return
        metrics = {"step": self.state.step, "epoch": self.state.epoch, "elapsed": round(self._elapsed(), 1)}
        if self.state.nonfinite_steps:
            metrics["nonfinite_steps"] = self.state.nonfinite_steps
        if self.setup.valid_examples:
            metrics["valid_loss"] = self.validation_loss()
            metrics["valid_ppl"] = math.exp(min(metrics["valid_loss"], 50))
            if self.setup.cfg.train.valid_bleu:
                # best.pt is chosen on valid_bleu: for a model of several directions, their mean
                for direction, bleu in self.validation_bleu().items():
                    metrics["valid_bleu" if direction == "all" else f"valid_bleu_{direction}"] = bleu
        # Before saving, so that a resumed run counts on from here.
        improved = self.state.record_validation(metrics, self.best_metric)
        self.stop_early = self.state.should_stop_early(self.setup.cfg.train)
        # last.pt last: it records this validation as done, so a crash before it is written leaves
        # a resume that validates this step again and writes the other files again, and a crash
        # after it has nothing left to lose. Likewise the metrics line first: a crash may leave a
        # line without its checkpoint (a resume trims it), never a checkpoint without its line.
        checkpoints = []
        if improved:
            checkpoints.append(self.setup.paths.best_checkpoint)
        if self.setup.cfg.train.keep_last:
            checkpoints.append(self.setup.paths.step_checkpoint(self.state.step))
        checkpoints.append(self.setup.paths.last_checkpoint)
        self.metrics_log.validation(metrics)
        self._save(checkpoints, metrics)
        if self.setup.cfg.train.keep_last:
            keep_newest_step_checkpoints(self.setup.paths, self.setup.cfg.train.keep_last)
        shown = "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        self.setup.display.log(f"validation: {shown}{'  (new best)' if improved else ''}")
        self.stop_early = self.setup.ranks.from_main(self.stop_early)

    def _save(self, paths: list[Path], metrics: dict) -> None:
        """Rank 0 writes the checkpoint to each of `paths`. Every process must call this at the same
        point: each contributes its random number generator states."""
        rng_by_rank = self.setup.ranks.gather(capture_rng_state())
        if self.setup.ranks.is_main:
            setup, state = self.setup, self.state
            training_state = state.to_checkpoint(
                self._elapsed(), setup.optimizer, setup.scheduler, setup.scaler, rng_by_rank
            )
            for path in paths:
                save_checkpoint(
                    path,
                    setup.cfg,
                    setup.tokenizers,
                    setup.model,
                    state.step,
                    state.epoch,
                    metrics,
                    training_state,
                    setup.lengths,
                )

    def _save_last(self, why: dict) -> None:
        """last.pt as the run stands, for a run that ends early; `why` joins its metrics."""
        self._save([self.setup.paths.last_checkpoint], {"step": self.state.step, "epoch": self.state.epoch, **why})

    # -- the loop -------------------------------------------------------------------------------

    def _budget_spent(self, elapsed: float) -> bool:
        """Whether train.max_steps or train.max_minutes is used up (train.max_epochs ends the loop itself)."""
        train = self.setup.cfg.train
        if train.max_steps is not None and self.state.step >= train.max_steps:
            return True
        return train.max_minutes is not None and elapsed >= train.max_minutes * 60

    def _eta(self, elapsed: float, steps_per_epoch: int) -> Optional[float]:
        """Seconds left until the first of the budgets runs out, at the mean pace so far."""
        train = self.setup.cfg.train
        seconds_per_step = elapsed / max(self.state.step, 1)
        total_steps = train.max_epochs * steps_per_epoch
        if train.max_steps is not None:
            total_steps = min(total_steps, train.max_steps)
        eta = (total_steps - self.state.step) * seconds_per_step
        if train.max_minutes is not None:
            eta = min(eta, train.max_minutes * 60 - elapsed)
        return eta

    def _batches_of_epoch(self, epoch: int) -> list[list[int]]:
        """The epoch's batches (positions into its examples); computed once per epoch."""
        if self._epoch_batches[0] != epoch:
            train = self.setup.cfg.train
            self._epoch_examples = self._examples_of_epoch(epoch)
            batches = (
                token_batches(self._epoch_examples, train.max_tokens, shuffle=True, seed=train.seed, epoch=epoch)
                if epoch > 0
                else []
            )
            self._epoch_batches = (epoch, batches)
        return self._epoch_batches[1]

    def _examples_of_epoch(self, epoch: int):
        """The training pairs drawn at their corpora's weights, train.casing's shares of them
        recased, and train.join.rate of them joined into longer ones: drawn anew each epoch."""
        join, data, seed = self.setup.cfg.train.join, self.setup.cfg.data, self.setup.cfg.train.seed
        examples = self.setup.train_examples
        if epoch == 0:
            return examples
        if data.weighted:
            weights = [corpus.weight for corpus in data.directed_corpora]
            examples = draw_epoch(examples, self.setup.corpus_sizes, weights, seed, epoch)
            drawn = np.bincount(
                np.searchsorted(np.cumsum(self.setup.corpus_sizes), examples.positions, side="right"),
                minlength=len(weights),
            )
            each = ", ".join(f"{c.label} {n:,}" for c, n in zip(data.directed_corpora, drawn.tolist()))
            self.setup.display.log(f"epoch {epoch}: {len(examples):,} pairs drawn at the corpora's weights ({each})")
        casing = self.setup.cfg.train.casing
        if casing.upper or casing.title:
            settings = CasingSettings(casing.upper, casing.title, data.max_source_tokens, data.max_target_tokens)
            examples = case_epoch(examples, self.setup.tokenizers, settings, seed, epoch)
        if join.rate == 0:
            return examples
        by_target: dict[str, tuple[str, str]] = {}
        for direction in data.directions:  # the first direction into a target language decides
            by_target.setdefault(direction.target, (joiner(direction.source), joiner(direction.target)))
        settings = JoinSettings(
            join.rate,
            join.max_pairs,
            *self.setup.cfg.longest_training_sides(),
            joiner(data.src_lang),
            joiner(data.tgt_lang),
            by_target=by_target if len(by_target) > 1 else None,
        )
        return join_epoch(examples, self.setup.tokenizers, settings, seed, epoch)

    def _next_update(self) -> Optional[list[list[int]]]:
        """The batches of the next update, starting the next epoch when this one is used up; None
        after the last epoch. An epoch's last update may have fewer than train.accumulate batches."""
        batches = self._batches_of_epoch(self.state.epoch)
        if self.state.batches_done >= len(batches):
            if self.state.epoch >= self.setup.cfg.train.max_epochs:
                return None
            self.state.epoch, self.state.batches_done = self.state.epoch + 1, 0
            batches = self._batches_of_epoch(self.state.epoch)
        return batches[self.state.batches_done : self.state.batches_done + self.setup.cfg.train.accumulate]

    def _updates_per_epoch(self) -> int:
        """Updates in the epoch in progress (its last may have fewer than train.accumulate batches)."""
        return math.ceil(len(self._batches_of_epoch(self.state.epoch)) / self.setup.cfg.train.accumulate)

    def _elapsed(self) -> float:
        """Training seconds so far, those before a resume included."""
        return self.state.elapsed + time.monotonic() - self._started

    def _log_resume_point(self) -> None:
        """Where in its epoch a resumed run picks up, for the log."""
        state = self.state
        if state.step:
            self.setup.display.log(
                f"resuming at step {state.step:,}: epoch {state.epoch}, after batch {state.batches_done} "
                f"of {len(self._batches_of_epoch(state.epoch))}"
            )

    def run(self) -> TrainResult:
        """Train until the run ends, then validate and save its last step unless that was just done; a
        signal, Ctrl-C or divergence saves last.pt instead and raises."""
        self._log_resume_point()
        self._started = time.monotonic()
        is_main = self.setup.ranks.is_main
        self.metrics_log = MetricsLog(self.setup.paths, resumed_at=self.state.step or None) if is_main else None
        if self.metrics_log is not None and self.metrics_log.tensorboard:
            self.setup.display.log(f"tensorboard: logging to {self.setup.paths.tensorboard_dir}")
        try:
            self._run_until_stopped()
            if self.state.validated_step != self.state.step:
                self.validate_and_save()
        finally:
            if self.metrics_log is not None:
                self.metrics_log.close()
        state = self.state
        return TrainResult(state.step, state.epoch, self._elapsed(), state.best_metrics, self.setup.paths)

    def _run_until_stopped(self) -> None:
        """The loop, and last.pt saved when a signal, Ctrl-C or divergence ends it early."""
        meter = _ThroughputMeter()
        # With several processes a mid-update stop would leave them out of step; torchrun, which
        # forwards a Ctrl-C as SIGTERM right after it, kills the processes itself if they hang.
        with stop_requests(second_stops_at_once=not self.setup.ranks.distributed) as stop:
            try:
                self._loop(meter, stop)
            except TrainingOutOfMemory as failed:
                self._save_after_out_of_memory(str(failed))
            except (KeyboardInterrupt, TrainingDiverged) as reason:
                # Skipped steps leave the parameters as they were, so even a diverged run saves sound work.
                why = "diverged" if isinstance(reason, TrainingDiverged) else "interrupted"
                self.setup.display.log(
                    f"{why}{f' ({reason})' if str(reason) else ''}: saving the last checkpoint before exiting"
                )
                self._save_last({why: True})
                raise

    def _save_after_out_of_memory(self, what_failed: str) -> None:
        """last.pt as it was before the update that ran out of memory, then the one line that says so.
        An update fails before the optimizer changes a parameter (forward and backward are where the
        memory goes), and its batches are counted only once it completes, so a resume repeats it."""
        self.setup.optimizer.zero_grad(set_to_none=True)  # the failed update's partial gradients
        gc.collect()
        if self.setup.device.type == "cuda":
            torch.cuda.empty_cache()
        saved_step = None
        # With several processes the others are mid-update and cannot join the save: none is written.
        if not self.setup.ranks.distributed:
            self.setup.display.log(
                f"out of memory: {what_failed} did not fit; saving the last checkpoint before exiting"
            )
            self._save_last({"out_of_memory": True})
            saved_step = self.state.step
        raise TrainingOutOfMemory(
            out_of_memory_message(what_failed, self.setup.device, self.setup.cfg.train, self.setup.paths, saved_step)
        ) from None

    def _agreed_stop(self, stop: StopRequest) -> bool:
        """Whether the budget is spent; raises TrainingInterrupted for a stop signal. Every process
        decides alike (a signal to any of them, or any one's clock running out, stops them all), so
        none is left waiting for the others."""
        local = 2 if stop.signal_name else 1 if self._budget_spent(self._elapsed()) else 0
        decision = self.setup.ranks.max(local)
        if decision == 2:
            raise TrainingInterrupted(stop.signal_name or "a signal to another process")
        return decision == 1

    def _local_batch(self, positions: Sequence[int]) -> Batch:
        """This process's share of one batch. A process left without examples (a batch smaller than
        the number of processes) runs one example with every label ignored: it adds nothing to the
        update, yet joins DDP's gradient all-reduce, which waits for every process."""
        mine = self.setup.ranks.share(positions)
        if len(mine) == 0:
            return collate([self._epoch_examples[positions[0]]]).without_labels().to(self.setup.device)
        return collate([self._epoch_examples[p] for p in mine]).to(self.setup.device)

    def _tokens_of(self, update: list[list[int]]) -> int:
        """Source and target tokens of the whole update (every process's share), EOS included,
        from the offsets: a process reads the ids of its own share only."""
        positions = np.concatenate(update)
        return self._epoch_examples.token_count(positions) + 2 * len(positions)

    def _loop(self, meter: "_ThroughputMeter", stop: StopRequest) -> None:
        """Updates until the budget, the epochs or early stopping end the run, logging and validating
        every train.log_every and train.valid_every steps."""
        train = self.setup.cfg.train
        while not self._agreed_stop(stop):
            update = self._next_update()
            if update is None:
                return
            result = self.train_step([self._local_batch(positions) for positions in update])
            self.state.batches_done += len(update)  # only once the update is complete, so an interrupt repeats it
            if not result.applied:
                continue  # no new step: nothing to log, validate or save
            meter.add(result.loss, self._tokens_of(update))
            if self.state.step % train.log_every == 0:
                status = self._status(meter)
                self.setup.display.update(status)
                if self.metrics_log is not None:
                    self.metrics_log.training(status.step, status.loss, status.learning_rate, status.tokens_per_second)
            if self.state.step % train.valid_every == 0:
                self.validate_and_save()
                if self.stop_early:
                    if self.setup.ranks.is_main:  # only rank 0 counted the validations
                        self.setup.display.log(self.state.early_stopping_reason(self.setup.cfg.train))
                    return
                self.setup.display.update(self._status(meter))
                meter.restart_window()  # validation time is not training throughput

    def _status(self, meter: "_ThroughputMeter") -> TrainingStatus:
        """The progress line's figures now."""
        elapsed = self._elapsed()
        return TrainingStatus(
            self.state.step,
            self.state.epoch,
            meter.loss_average,
            self.setup.scheduler.get_last_lr()[0],
            meter.tokens_per_second(),
            elapsed,
            self._eta(elapsed, self._updates_per_epoch()),
            self._best_text(),
            self.state.nonfinite_steps,
        )

    def _best_text(self) -> str:
        """The best validation so far, for the progress line; empty before the first."""
        if "valid_bleu" in self.state.best_metrics:
            return f"BLEU {self.state.best_metrics['valid_bleu']:.1f}"
        if "valid_loss" in self.state.best_metrics:
            return f"loss {self.state.best_metrics['valid_loss']:.3f}"
        return ""


class _ThroughputMeter:
    """A smoothed training loss, and tokens per second since the last display update."""

    def __init__(self) -> None:
        self.loss_average = float("nan")
        self.rate = 0.0
        self.restart_window()

    def restart_window(self) -> None:
        """Count tokens per second from now on."""
        self._tokens, self._since = 0, time.monotonic()

    def add(self, loss: float, tokens: int) -> None:
        """One applied update's mean loss and the tokens it trained on."""
        self.loss_average = loss if math.isnan(self.loss_average) else 0.98 * self.loss_average + 0.02 * loss
        self._tokens += tokens

    def tokens_per_second(self) -> float:
        """The rate over the window since the last call; the previous rate when no step ran since."""
        if self._tokens:
            self.rate = self._tokens / max(time.monotonic() - self._since, 1e-9)
        self.restart_window()
        return self.rate


def train(cfg: Config, display: Optional[TrainingDisplay] = None, resume: bool = False) -> TrainResult:
    """Train a run from scratch, or with `resume` continue it exactly where RUN/checkpoints/last.pt left off.
    Started by torchrun, this is one of several processes training together; rank 0 alone displays."""
    with process_group(cfg.train.device) as ranks, run_directory_lock(RunPaths.of(cfg.run_dir), held=ranks.is_main):
        display = (display or TrainingDisplay()) if ranks.is_main else TrainingDisplay(quiet=True)
        with display:
            return Trainer(setup_training(cfg, display, resume, ranks)).run()
