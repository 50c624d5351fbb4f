"""What each `attn` command does, between parsing (cli.py) and the library modules.

Every problem a user can fix is raised as `UserError` with a message that names the file, line or
config key and the fix; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from attn_cli.training.average import average_checkpoints
from attn_cli.training.checkpoint import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint
from attn_cli.decoding.attention_view import numbered_path, render_alignment, save_attention, translation_attention
from attn_cli.decoding.io import TranslationWriter, read_lines, read_parallel, stdin_batches
from attn_cli.config import ConfigError, DecodeConfig, load_config
from attn_cli.data.corpus import DataError
from attn_cli.training.distributed import is_main_process
from attn_cli.errors import UserError
from attn_cli.decoding.scoring import score_translations
from attn_cli.paths import RunPaths, default_run_dir, hypotheses_file
from attn_cli.data.prepare import read_splits, train_or_load_tokenizers, write_splits
from attn_cli.training.progress import TrainingDisplay, format_duration
from attn_cli.data.tokenizer import TokenizerError
from attn_cli.training.trainer import resolve_device, train as run_training
from attn_cli.training.step import TrainingDiverged
from attn_cli.decoding.translate import Translation, override_decode, translate_sentences


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's own error types into one-line messages."""
    try:
        yield
    except (ConfigError, DataError, CheckpointError, TokenizerError, TrainingDiverged) as error:
        raise UserError(str(error)) from None


def train(config_path: Path, overrides: Sequence[str], resume: bool, console: Console) -> None:
    with user_errors():
        cfg = load_config(config_path, overrides)
        try:
            result = run_training(cfg, TrainingDisplay(console), resume=resume)
        except KeyboardInterrupt as stop:
            if not is_main_process():
                raise SystemExit(2) from None  # rank 0 says where the checkpoint is, once rank 0 has written it
            paths = RunPaths.of(cfg.run_dir)
            signal_name = f" by {stop}" if str(stop) else ""
            saved = (f"; the last checkpoint is in {paths.last_checkpoint}; continue with "
                     f"`attn train --config {paths.config} --resume`" if paths.last_checkpoint.is_file()
                     else " before the first checkpoint")
            raise UserError(f"interrupted{signal_name}{saved}") from None
    if not is_main_process():
        return  # rank 0 of a torchrun run reports for all its processes
    best = result.best_metrics
    score = f", best validation BLEU {best['valid_bleu']:.2f}" if "valid_bleu" in best else ""
    console.print(f"trained {result.step:,} steps ({result.epoch} epochs) in {format_duration(result.elapsed)}{score}; "
                  f"checkpoints in {result.paths.checkpoint_dir}", highlight=False)


def tokenizer(config_path: Path, overrides: Sequence[str], retrain: bool, console: Console) -> None:
    with user_errors():
        cfg = load_config(config_path, overrides)
        splits = read_splits(cfg, console.print)
        write_splits(cfg, splits)
        tokenizers = train_or_load_tokenizers(cfg, splits, console.print, retrain=retrain)
    sample = splits.train[0] if splits.train else ("Hello, world.", "你好，世界。")
    console.print(f"example: {' '.join(tokenizers.source.encode_pieces([sample[0]])[0])}  |  "
                  f"{' '.join(tokenizers.target.encode_pieces([sample[1]])[0])}", highlight=False)


def load_translator(run: Optional[Path], checkpoint: Optional[Path], device: str) -> Checkpoint:
    with user_errors():
        path = find_checkpoint(run, checkpoint)
        return load_checkpoint(path, resolve_device(device, "--device"))


# The translate and eval flags that override the config's `decode` section.
DECODE_FLAGS = {"beam_size": "--beam", "n_best": "--n-best", "length_penalty": "--length-penalty",
                "max_len_a": "--max-len-a", "max_len_b": "--max-len-b", "max_tokens": "--batch-size",
                "sample": "--sample", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                "seed": "--seed"}


def decode_options(decode: DecodeConfig, flags: dict[str, Any]) -> DecodeConfig:
    """The checkpoint's decode settings with the flags the user gave (None = not given)."""
    try:
        return override_decode(decode, flags)
    except ConfigError as error:
        # Name this command's flags, not the config keys: "--n-best: 4 is more than --beam=2", not
        # "decode.n_best: 4 is more than beam_size=2"; a problem of the whole section has no prefix.
        names = {f"decode.{key}": DECODE_FLAGS[key] for key in flags}
        raise UserError(error.describe({"decode": None, **names})) from None


@dataclass
class Inspection:
    """What `--show-attention` draws and `--attention-out` saves."""
    show: bool = False
    layer: int = -1
    head: Optional[int] = None
    output: Optional[Path] = None

    @property
    def wanted(self) -> bool:
        return self.show or self.output is not None


class _Translator:
    """A loaded checkpoint with the decode options of this command."""

    def __init__(self, loaded: Checkpoint, options: DecodeConfig):
        self.loaded, self.options = loaded, options

    def __call__(self, sentences: Sequence[str], on_batch=None) -> list[Translation]:
        cfg = self.loaded.config
        return translate_sentences(self.loaded.model, self.loaded.tokenizers, sentences, self.options,
                                   cfg.model.max_positions - 1, cfg.data.tgt_lang, on_batch)

    def translate_with_progress(self, sentences: Sequence[str], console: Console) -> list[Translation]:
        with _progress(console) as progress:
            task = progress.add_task("translating", total=None)
            return self(sentences, on_batch=lambda done, total: progress.update(task, completed=done, total=total))


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=True)


def translate(texts: Sequence[str], run: Optional[Path], checkpoint: Optional[Path], input_file: Optional[Path],
              output_file: Optional[Path], device: str, decode_flags: dict[str, Any], output_format: str,
              inspection: Inspection, console: Console) -> None:
    if texts and input_file:
        raise UserError("give sentences as arguments or with --input FILE, not both")
    if not texts and not input_file and sys.stdin.isatty():
        raise UserError('nothing to translate: give sentences as arguments (attn translate "Hello"), '
                        "--input FILE, or pipe lines to stdin")
    lines = read_lines(input_file) if input_file else None
    loaded = load_translator(run, checkpoint, device)
    translator = _Translator(loaded, decode_options(loaded.config.decode, decode_flags))
    try:
        out = output_file.open("w", encoding="utf-8") if output_file else sys.stdout
    except OSError as error:
        raise UserError(f"cannot write --output {output_file}: {error.strerror}") from None
    writer = TranslationWriter(out, output_format, lambda message: console.print(message, highlight=False), where=input_file or ("stdin" if not texts else "argument"))
    try:
        if texts:
            translations = translator(texts)
        elif lines is not None:
            translations = translator.translate_with_progress(lines, console)
        else:  # stdin: each batch of lines is written as soon as it is translated, so attn works in a pipe
            for batch in stdin_batches(sys.stdin):
                translations = translator(batch)
                writer.write(translations)
                if inspection.wanted:
                    _inspect(loaded, translations, inspection, console, first=writer.count - len(batch), numbered=True)
            return
        writer.write(translations)
        if inspection.wanted:
            _inspect(loaded, translations, inspection, console, first=0, numbered=len(translations) > 1)
    except BrokenPipeError:  # the reader went away (`attn translate ... | head -1`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # keep the exit-time flush quiet
    finally:
        if output_file:
            out.close()


def _inspect(loaded: Checkpoint, translations: Sequence[Translation], inspection: Inspection,
             console: Console, first: int, numbered: bool) -> None:
    """Draw and/or save the attention of each translation's best hypothesis (first part of a split
    input). Numbered files are named by input line: attention.json -> attention.0.json, ..."""
    for number, translation in enumerate(translations, start=first):
        found = translation_attention(loaded.model, loaded.tokenizers, translation)
        if found is None:
            continue
        if inspection.show:
            console.print(render_alignment(*found, inspection.layer, inspection.head))
        if inspection.output is not None:
            path = numbered_path(inspection.output, number) if numbered else inspection.output
            save_attention(path, *found)
            console.print(f"attention weights written to {path}", highlight=False)


def evaluate(bleu: bool, run: Optional[Path], checkpoint: Optional[Path], src: Optional[Path], ref: Optional[Path],
             device: str, decode_flags: dict[str, Any], console: Console) -> None:
    if (src is None) != (ref is None):
        raise UserError("--src and --ref go together: give both, or neither to score the run's test split")
    with user_errors():
        checkpoint_path = find_checkpoint(run, checkpoint)
    loaded = load_translator(None, checkpoint_path, device)
    # Only the best translation is scored: a config's decode.n_best must not clash with --beam.
    translator = _Translator(loaded, decode_options(dataclasses.replace(loaded.config.decode, n_best=1), decode_flags))
    cfg = loaded.config
    if src is None:
        paths = RunPaths.of(run) if run is not None else RunPaths.of_checkpoint(checkpoint_path)
        src = paths.split_file("test", cfg.data.src_lang)
        ref = paths.split_file("test", cfg.data.tgt_lang)
        if not src.is_file():
            raise UserError(f"no test split at {src}; it is written by `attn train`, or pass --src FILE --ref FILE")
    sources, references = read_parallel(src, ref)
    hypotheses = [translation.texts[0] for translation in translator.translate_with_progress(sources, console)]
    hypotheses_path = hypotheses_file(checkpoint_path, src)
    hypotheses_path.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    console.print(f"{len(sources):,} sentences from {src}; hypotheses written to {hypotheses_path}", highlight=False)
    if bleu:
        for score in score_translations(hypotheses, references, cfg.data.tgt_lang):
            print(score)


def average(run: Optional[Path], last: int, output: Optional[Path], console: Console) -> None:
    paths = RunPaths.of(run if run is not None else default_run_dir())
    found = paths.step_checkpoints()
    if len(found) < last:
        held = f" ({', '.join(p.name for p in found)})" if found else ""
        raise UserError(f"--last {last} needs {last} step checkpoints, but {paths.checkpoint_dir} holds {len(found)}"
                        f"{held}; train with train.keep_last: {last} or more, or lower --last")
    chosen = found[-last:]
    output = output if output is not None else paths.average_checkpoint(last)
    with user_errors():
        averaged = average_checkpoints(chosen, output)
    steps = ", ".join(f"{step:,}" for step in averaged.metrics["averaged_steps"])
    console.print(f"averaged the weights of steps {steps} into {output}; use it with "
                  f"`attn translate --checkpoint {output}` or `attn eval --checkpoint {output}`", highlight=False)
