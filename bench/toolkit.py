"""What the benchmarks share: the machine they ran on, a free loopback port, a server process
started and waited for, timings taken in alternation, percentiles, and the JSON report.

Timings of two systems are taken in turn, round after round (`alternate`), so that a slow spell of a
shared machine falls on all of them rather than on one; figures are medians and ratios of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent


def machine_info() -> dict:
    """The CPU, its logical cores, the platform and Python: what every report records."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def parser(
    doc: Optional[str], smoke: str = "a tiny, fast run to check that the benchmark works"
) -> argparse.ArgumentParser:
    """An argument parser with the module's docstring as its help, --json and --smoke."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--json", type=Path, help="Write the results here as JSON.")
    made.add_argument("--smoke", action="store_true", help=f"Smoke mode: {smoke}; its figures mean nothing.")
    return made


def write_report(path: Optional[Path], results: Mapping[str, Any], args: Optional[argparse.Namespace] = None) -> None:
    """`results` as JSON at `path` (nothing when None), with the machine, the command line and the time."""
    if path is None:
        return
    report = {
        "machine": machine_info(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "arguments": vars(args) if args else None,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        **results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; numbers right-aligned."""

    def cell(value: Any) -> str:
        return "" if value is None else str(value)

    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The nearest-rank q-th percentile (0-100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))]


def median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def alternate(
    systems: Mapping[str, Callable[[], Any]],
    repeats: int,
    warmup: bool = True,
    check: Callable[[str, Any], None] = None,
) -> dict[str, list[float]]:
    """Seconds of each system's call, `repeats` rounds in which every system runs once in turn,
    after one untimed warm-up call each. `check(name, result)` may verify each result (outside
    the timing)."""
    if warmup:
        for name, call in systems.items():
            result = call()
            if check is not None:
                check(name, result)
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(repeats):
        for name, call in systems.items():
            started = time.perf_counter()
            result = call()
            seconds[name].append(time.perf_counter() - started)
            if check is not None:
                check(name, result)
    return seconds


def attn_model(dims: Mapping[str, int], vocab: int, dropout: float):
    """attn's Transformer of `dims`' d_model, num_heads, ffn_dim and layers, one vocabulary shared,
    seeded with 0: what the speed benchmarks time against its peer (`marian_like`)."""
    import torch

    from attn_cli.model import Transformer

    torch.manual_seed(0)
    layers = dims["layers"]  # as many in the encoder as in the decoder
    return Transformer(vocab, vocab, dims["d_model"], dims["num_heads"], dims["ffn_dim"], layers, layers, dropout)


def marian_like(dims: Mapping[str, int], vocab: int, dropout: float):
    """A Transformers `MarianMTModel` of attn's shape, the peer of the speed benchmarks: `dims`'
    d_model, num_heads, ffn_dim and layers, ReLU, scaled, tied and shared embeddings, attn's special
    ids, dropout on sublayer outputs and embeddings only; post-LN, as Marian is. Seeded with 0."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

    config = MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        d_model=dims["d_model"],
        encoder_attention_heads=dims["num_heads"],
        decoder_attention_heads=dims["num_heads"],
        encoder_ffn_dim=dims["ffn_dim"],
        decoder_ffn_dim=dims["ffn_dim"],
        encoder_layers=dims["layers"],
        decoder_layers=dims["layers"],
        max_position_embeddings=256,
        activation_function="relu",  # as attn (Marian's defaults: GELU, no scaling)
        scale_embedding=True,
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,  # Marian's default, 0, would force attn's padding id as the last token
    )
    torch.manual_seed(0)
    return MarianMTModel(config)


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")  # Debian's packages


def chromium_options(profile: Path, width: int, height: int):
    """Selenium's options for Debian's Chromium, headless, offline (no background connections to a
    network this machine may not have), with its own profile at `profile`: what the page's test and
    its screenshot drive."""
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    return options


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> Optional[float]:
    """A process's resident memory in MB, from /proc; None where that cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def get_json(port: int, path: str, timeout: float = 5.0) -> Any:
    """GET http://127.0.0.1:port/path, its JSON body."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return json.loads(response.read())


def post_json(port: int, path: str, body: Mapping[str, Any], timeout: float = 60.0) -> tuple[int, Any]:
    """POST a JSON body to http://127.0.0.1:port/path; (status, JSON answer), errors included."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@dataclass
class ServerProcess:
    """A server in its own process on 127.0.0.1:`port`, ready once GET `ready_path` answers."""

    name: str
    argv: list[str]
    port: int
    log: Path
    ready_path: str = "/health"
    env: dict = field(default_factory=lambda: dict(os.environ))
    cwd: Optional[Path] = None
    process: Optional[subprocess.Popen] = None
    started_in: Optional[float] = None  # seconds from the start to the first answer

    def start(self, timeout: float = 120.0) -> ServerProcess:
        started = time.perf_counter()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL
            )
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                get_json(self.port, self.ready_path, timeout=2)
                self.started_in = round(time.perf_counter() - started, 1)
                return self
            except (OSError, ValueError):
                time.sleep(0.25)
        self.stop(10)
        raise RuntimeError(f"{self.name} did not answer GET {self.ready_path} within {timeout:g} s:\n{self.log_tail()}")

    @property
    def rss(self) -> Optional[float]:
        return rss_mb(self.process.pid) if self.process else None

    def stop(self, timeout: float = 30.0) -> dict:
        """SIGTERM, then the exit status (SIGKILL after `timeout` seconds, recorded as such)."""
        if self.process is None:
            return {"exit_status": None, "note": "never started"}
        if self.process.poll() is not None:
            return {"exit_status": self.process.returncode, "stopped_in_s": 0.0, "note": "had already exited"}
        began = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout)
            note = "stopped by SIGTERM"
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
            note = f"did not stop within {timeout:g} s of SIGTERM: killed"
        if status < 0:
            note += f" (ended by {signal.Signals(-status).name}: no handler of its own)"
        return {"exit_status": status, "stopped_in_s": round(time.perf_counter() - began, 2), "note": note}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def attn_serve(
    name: str, arguments: Sequence[str], log_dir: Path, threads: int = 1, device: str = "cpu"
) -> ServerProcess:
    """`attn serve ARGUMENTS` on a free port, on `device` (the CPU unless told), `threads` threads
    (not started yet)."""
    port = free_port()
    argv = [sys.executable, "-m", "attn_cli", "serve", *arguments, "--port", str(port), "--device", device]
    argv += ["--threads", str(threads)]
    return ServerProcess(name, argv, port, log_dir / f"{name.replace(' ', '_')}.log", cwd=REPO)


def attn(*arguments: str, cwd: Optional[Path] = None) -> str:
    """Run `attn ARGUMENTS` (this checkout's) and return its stdout; a failure raises with its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "attn_cli", *map(str, arguments)], capture_output=True, text=True, cwd=cwd or REPO
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"attn {' '.join(map(str, arguments))} failed ({result.returncode}):\n{result.stderr[-3000:]}"
        )
    return result.stdout


def settings(*pairs: str) -> list[str]:
    """`--set KEY=VALUE` for each of `pairs`: config overrides for `attn train`."""
    return [part for pair in pairs for part in ("--set", pair)]


def eval_scores(output: str) -> dict[str, float]:
    """The corpus scores that `attn eval` printed ("BLEU = 28.66 ...", "chrF = ..."), by lower-case
    name; the first of each where it printed several."""
    found: dict[str, float] = {}
    for name, value in re.findall(r"^(BLEU|chrF) = ([\d.]+)", output, flags=re.MULTILINE):
        found.setdefault(name.lower(), float(value))
    return found


def tiny_run(directory: Path, steps: int = 30) -> Path:
    """A run of the built-in tiny config trained for `steps` updates in `directory` (reused when it
    is there): what every --smoke mode decodes with."""
    if not (directory / "checkpoints" / "best.pt").is_file():
        attn("train", "--config", "tiny.yaml", "--set", f"run_dir={directory}", "--set", f"train.max_steps={steps}")
    return directory
