"""What each `attn` command does, between parsing (cli.py) and the library modules.

Every problem a user can fix is raised as `UserError` with a message that names the file, line or
config key and the fix; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from attn_cli.average import average_checkpoints
from attn_cli.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from attn_cli.config import ConfigError, load_config
from attn_cli.data import DataError
from attn_cli.decode import translate_sentences
from attn_cli.errors import UserError
from attn_cli.evaluate import score_translations
from attn_cli.paths import RunPaths
from attn_cli.prepare import read_splits, train_or_load_tokenizers, write_splits
from attn_cli.progress import TrainingDisplay, format_duration
from attn_cli.tokenizer import TokenizerError
from attn_cli.train import resolve_device, train as run_training
from attn_cli.training_step import TrainingDiverged

DEFAULT_CONFIG = Path("configs/en-zh.yaml")


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
            paths = RunPaths.of(cfg.run_dir)
            signal_name = f" by {stop}" if str(stop) else ""
            saved = (f"; the last checkpoint is in {paths.last_checkpoint}; continue with "
                     f"`attn train --config {paths.config} --resume`" if paths.last_checkpoint.is_file()
                     else " before the first checkpoint")
            raise UserError(f"interrupted{signal_name}{saved}") from None
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


def default_run_dir() -> Path:
    """The run of the default config, so `attn translate` works right after `attn train`."""
    if DEFAULT_CONFIG.is_file():
        with contextlib.suppress(ConfigError):
            return Path(load_config(DEFAULT_CONFIG).run_dir)
    return Path("runs/en-zh")


def find_checkpoint(run: Optional[Path], checkpoint: Optional[Path]) -> Path:
    if checkpoint is not None:
        if not checkpoint.is_file():
            raise UserError(f"checkpoint not found: {checkpoint}")
        return checkpoint
    paths = RunPaths.of(run if run is not None else default_run_dir())
    for candidate in (paths.best_checkpoint, paths.last_checkpoint):
        if candidate.is_file():
            return candidate
    raise UserError(f"no checkpoint in {paths.checkpoint_dir} (looked for best.pt and last.pt); "
                    f"train one with `attn train --config configs/en-zh.yaml`, or pass --run DIR or --checkpoint PATH")


def load_translator(run: Optional[Path], checkpoint: Optional[Path], device: str) -> Checkpoint:
    path = find_checkpoint(run, checkpoint)
    with user_errors():
        return load_checkpoint(path, resolve_device(device, "--device"))


def _translate(loaded: Checkpoint, sentences: Sequence[str], progress: Optional[Progress] = None) -> list[str]:
    cfg = loaded.config
    task = progress.add_task("translating", total=len(sentences)) if progress else None
    return translate_sentences(loaded.model, loaded.tokenizers, sentences, cfg.decode.max_len_a,
                               cfg.decode.max_len_b, cfg.decode.max_tokens,
                               on_batch=(lambda n: progress.advance(task, n)) if progress else None)


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=True)


def read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not valid UTF-8 at byte {error.start}; convert it with `iconv -t utf-8`") from None


def translate(texts: Sequence[str], run: Optional[Path], checkpoint: Optional[Path], input_file: Optional[Path],
              output_file: Optional[Path], device: str, console: Console) -> None:
    if texts and input_file:
        raise UserError("give sentences as arguments or with --input FILE, not both")
    if not texts and not input_file and sys.stdin.isatty():
        raise UserError('nothing to translate: give sentences as arguments (attn translate "Hello"), '
                        "--input FILE, or pipe lines to stdin")
    lines = read_lines(input_file) if input_file else None
    loaded = load_translator(run, checkpoint, device)
    try:
        out = output_file.open("w", encoding="utf-8") if output_file else sys.stdout
    except OSError as error:
        raise UserError(f"cannot write --output {output_file}: {error.strerror}") from None
    try:
        if texts:
            _write(out, _translate(loaded, texts))
        elif lines is not None:
            with _progress(console) as progress:
                _write(out, _translate(loaded, lines, progress))
        else:  # stdin, line by line, so attn works at the end of a pipe
            for line in sys.stdin:
                _write(out, _translate(loaded, [line.rstrip("\n")]))
                out.flush()
    finally:
        if output_file:
            out.close()


def _write(out, lines: Sequence[str]) -> None:
    for line in lines:
        out.write(line + "\n")


def evaluate(bleu: bool, run: Optional[Path], checkpoint: Optional[Path], src: Optional[Path], ref: Optional[Path],
             device: str, console: Console) -> None:
    if (src is None) != (ref is None):
        raise UserError("--src and --ref go together: give both, or neither to score the run's test split")
    checkpoint_path = find_checkpoint(run, checkpoint)
    loaded = load_translator(None, checkpoint_path, device)
    cfg = loaded.config
    if src is None:
        # A checkpoint lives in RUN/checkpoints/, so its run is two levels up.
        paths = RunPaths.of(run if run is not None else checkpoint_path.parent.parent)
        src = paths.split_file("test", cfg.data.src_lang)
        ref = paths.split_file("test", cfg.data.tgt_lang)
        if not src.is_file():
            raise UserError(f"no test split at {src}; it is written by `attn train`, or pass --src FILE --ref FILE")
    sources, references = read_lines(src), read_lines(ref)
    if len(sources) != len(references):
        raise UserError(f"{src} has {len(sources)} lines but {ref} has {len(references)}; they must pair up line by line")
    with _progress(console) as progress:
        hypotheses = _translate(loaded, sources, progress)
    hypotheses_path = checkpoint_path.with_name(f"{checkpoint_path.stem}.{src.name}.hyp")
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
