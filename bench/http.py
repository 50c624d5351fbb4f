"""`attn serve` under load over loopback HTTP, against LibreTranslate serving the same model.

Each system is a server in its own process on a free 127.0.0.1 port, started one at a time, waited
for (bounded by --start-timeout), and stopped with SIGTERM after its cells (its exit status is
recorded). The systems: `attn serve` with the run's checkpoint (PyTorch) and with its CTranslate2
int8 export, each with batching on and off (--no-batching: one request per decoding call, the
one-at-a-time baseline), and the peer: LibreTranslate with the run exported as an Argos package
(`attn export --format argos`), installed into a private directory and started offline, or with
--peer ct2-fastapi the CTranslate2 + FastAPI wrapper a CTranslate2 user writes, on the same int8
export.

The load: C clients (--concurrency, default 1, 4, 16, 64), each sending one sentence per request to
`POST /translate` (LibreTranslate's API, the same JSON body for every system:
{"q": sentence, "source": SRC, "target": TGT}), waiting for the answer and sending the next, until
--seconds have passed or --max-requests were sent. The sentences are the run's test split with
every tenth request a long one: consecutive test sentences joined with commas until they hold at
least --long-words words. Before each cell a warm-up of --warmup requests per client is sent and not
timed. Per cell: sentences/s (200 answers / wall time), the p50/p95/p99 latency of the 200
answers, the failures by status (429 separately) or exception, the server's RSS (VmRSS) before and
after, the load generator's CPU time, and for attn the decoding calls (/health).

The load generator is the benchmark's own process: one asyncio loop, one keep-alive connection per
client and a minimal HTTP/1.1 client over asyncio streams (no HTTP library: it shares the machine's
cores with the server, so it should cost little; its CPU share is reported per cell).

Decoding settings (--decode): `peer` (the default) serves attn with the settings Argos decodes with,
beam 4, length penalty 0.2 (attn's GNMT form; CTranslate2's in Argos), at most 256 tokens
(max_len_a 0, max_len_b 256), written into a copy of the checkpoint and of the export
(LibreTranslate's /translate takes no decoding options); `run` keeps the run's and sets Argos's beam
to the run's (ARGOS_BEAM_SIZE; its length penalty stays 0.2).

Then the mixed load (--mixed-seconds, 0 to skip), on a fresh server of each of --mixed-systems:
--mixed-short-clients (16) clients send short test sentences to /translate, alone and then beside
--mixed-long-clients (2) clients sending /v1 requests of --mixed-long-lines (128) long sentences at
--max-beam (16), which wait a second after a 429: the short requests' p50/p95 in both phases, every
status, the server's RSS before, during (peak) and after. Then two probes, each a request followed
one second later by a short one (its status and seconds): `max_len_b: 100000`, and four lines of
nearly 2,000 characters at the widest beam. Last, SIGTERM with the mixed load in flight: the exit
status and how long it took.

Then the soak (--soak-seconds, 0 to skip): a fresh attn PyTorch server with batching, warmed up with
--soak-warmup seconds of load, then 64 clients (--soak-clients) for the soak; it reports errors
other than 429, whether every request the server accepted (/health's count) was answered, and the
server's RSS at its start and end and its peak (sampled every few seconds), checked within 50 MB.

A peer that cannot run here (LibreTranslate not installed) is reported unavailable and skipped.
Every server listens on 127.0.0.1 only; the load is bounded by --seconds and --max-requests.

    python3 -m bench.http --run runs/en-zh --json bench_results/http.json
    python3 -m bench.http --run runs/en-zh --peer ct2-fastapi --workdir /tmp/bh --json bench_results/http.json
    python3 -m bench.http --smoke --json /tmp/http-smoke.json     # a tiny run, attn's servers only
    python3 -m bench.http --run runs/gpu --device cuda --systems pytorch,int8 --concurrency 16,64 \
        --soak-seconds 0 --mixed-seconds 0                         # attn serve on a GPU

--workdir DIR keeps the served checkpoint (DIR/http/checkpoint.pt) and int8 export (DIR/http/int8)
with the decoding settings served, for `python3 -m bench.batch_gain`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bench.toolkit import (
    ServerProcess,
    attn,
    attn_serve,
    free_port,
    get_json,
    machine_info,
    parser,
    percentile,
    tiny_run,
    write_report,
)

SYSTEMS = ("pytorch", "pytorch-single", "int8", "int8-single", "peer")
# What Argos Translate decodes with (argostranslate/translate.py: beam 4, length penalty 0.2,
# CTranslate2's default of at most 256 tokens): attn's decode keys for the same search.
PEER_DECODE = {"beam_size": 4, "length_penalty": 0.2, "max_len_a": 0.0, "max_len_b": 256}
SOAK_RSS_LIMIT_MB = 50.0


# ---------------------------------------------------------------------------------------------
# A minimal HTTP/1.1 client over asyncio streams: one keep-alive connection per simulated client.


class Connection:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None

    async def request(self, method: str, path: str, body: Optional[bytes] = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write((head + "\r\n").encode("ascii") + (body or b""))
        await self.writer.drain()
        reader = self.reader
        line = await reader.readline()
        if not line:
            raise ConnectionError("the server closed the connection without answering")
        status = int(line.split(None, 2)[1])
        length, chunked, close = None, False, line.startswith(b"HTTP/1.0")
        while True:
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                chunked = True
            elif name == b"connection":
                close = value == b"close"
        if chunked:
            parts = []
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                parts.append(await reader.readexactly(size))
                await reader.readline()
            data = b"".join(parts)
        elif length is not None:
            data = await reader.readexactly(length)
        else:
            data, close = await reader.read(), True
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def post_translate(connection: Connection, body: bytes, timeout: float) -> tuple[int, Optional[str]]:
    """The status and the translation (None unless a 200 with a string translatedText)."""
    status, data = await asyncio.wait_for(connection.request("POST", "/translate", body), timeout)
    if status != 200:
        return status, None
    try:
        text = json.loads(data).get("translatedText")
    except (ValueError, AttributeError):
        text = None
    return status, text if isinstance(text, str) else None


# ---------------------------------------------------------------------------------------------
# The load: closed-loop clients, bounded by time and by requests.


@dataclass
class Load:
    wall: float
    cpu: float  # the load generator's CPU seconds
    latencies: list[float]  # seconds, of the 200 answers
    failures: dict[str, int]  # status or exception name -> count
    sent: int


async def run_load(
    port: int, bodies: list[bytes], clients: int, seconds: float, max_requests: int, timeout: float, offset: int = 0
) -> Load:
    """`clients` clients, each sending the next body and waiting for its answer, until `seconds`
    have passed or `max_requests` were sent; requests in flight at the deadline are waited for."""
    connections = [Connection("127.0.0.1", port) for _ in range(clients)]
    sent, latencies, failures = [0], [], {}
    started = time.perf_counter()
    deadline = started + seconds

    async def client(connection: Connection) -> None:
        while sent[0] < max_requests and time.perf_counter() < deadline:
            body = bodies[(offset + sent[0]) % len(bodies)]
            sent[0] += 1
            begun = time.perf_counter()
            try:
                status, text = await post_translate(connection, body, timeout)
            except Exception as error:  # a refused or broken connection, a timeout
                connection.close()
                key = type(error).__name__
            else:
                if status == 200 and text is not None:
                    latencies.append(time.perf_counter() - begun)
                    continue
                key = str(status) if status != 200 else "200 without translatedText"
            failures[key] = failures.get(key, 0) + 1

    cpu = time.process_time()
    try:
        await asyncio.gather(*(client(c) for c in connections))
    finally:
        for connection in connections:
            connection.close()
    return Load(time.perf_counter() - started, time.process_time() - cpu, latencies, failures, sent[0])


def ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds * 1000, 1)


# ---------------------------------------------------------------------------------------------
# Sentences.


def long_sentences(sentences: list[str], words: int) -> list[str]:
    """Consecutive sentences joined with commas (their own final . ! ? … dropped) until the line
    has at least `words` words: one sentence for attn and for Argos, which splits a line at . ! ?"""
    found, parts = [], []
    for sentence in sentences:
        parts.append(sentence)
        if sum(len(part.split()) for part in parts) >= words:
            found.append(", ".join([re.sub(r"[.!?…]+$", "", part) for part in parts[:-1]] + [parts[-1]]))
            parts = []
    return found


def request_mix(sentences: list[str], long: list[str], every: int) -> list[str]:
    """The test sentences in order with every `every`-th request a long one."""
    mix = []
    for index, sentence in enumerate(sentences):
        mix.append(sentence)
        if long and every > 1 and (index + 1) % (every - 1) == 0:
            mix.append(long[len(mix) // every % len(long)])
    return mix


# ---------------------------------------------------------------------------------------------
# Servers.


def attn_server(name: str, what: list[str], batching: bool, args, work: Path, extra: list[str]) -> ServerProcess:
    """`attn serve` of `what` on a free port, --device, --threads threads, batching on or off (not started)."""
    arguments = [*what, "--batching" if batching else "--no-batching", *extra]
    return attn_serve(name, arguments, work, args.threads, args.device)


# ---------------------------------------------------------------------------------------------
# Preparing the models: the decoding settings, the int8 export, the Argos package.


def set_export_decode(directory: Path, decode: dict) -> None:
    import yaml

    config_file = directory / "attn.yaml"
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    config["decode"].update(decode)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PEER_NAMES = {"libretranslate": "LibreTranslate", "ct2-fastapi": "CTranslate2 + FastAPI"}


def peer_missing(args) -> Optional[str]:
    """Why the chosen peer cannot run here (None when it can): LibreTranslate is installed apart, in
    a virtual environment of its own; the CTranslate2 + FastAPI wrapper needs those packages here."""
    if args.peer == "libretranslate":
        binary = Path(args.libretranslate)
        if not binary.is_file() or not (binary.parent / "python").is_file():
            return (
                f"no LibreTranslate at {binary} (with its python beside it): install it in a virtual "
                "environment and pass --libretranslate VENV/bin/libretranslate, or use --peer ct2-fastapi"
            )
        return None
    from importlib.util import find_spec

    absent = [name for name in ("ctranslate2", "fastapi", "uvicorn", "sentencepiece") if find_spec(name) is None]
    return f"{', '.join(absent)} not installed" if absent else None


def libretranslate_server(
    args, work: Path, checkpoint: Path, languages: tuple[str, str], beam: int
) -> tuple[ServerProcess, Path]:
    """LibreTranslate with the checkpoint's Argos package, in a private home, started offline: it
    downloads models when fewer than two packages are installed, so it is given a local package
    index that lists the installed one (nothing to update) and the package's sentence splitter in
    MiniSBD's cache (nothing to download). With its model file, to compare with attn's."""
    from attn_cli.export.argos import argos_code
    from attn_cli.export.sentence_splitter import minisbd_model

    binary = Path(args.libretranslate)
    python = binary.parent / "python"
    home = work / "lt-home"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ARGOS_", "LT_", "PYTHON"))}
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        ARGOS_PACKAGE_INDEX=f"file://{home / 'index'}/",
        ARGOS_DEVICE_TYPE="cpu",
        ARGOS_INTER_THREADS="1",
        ARGOS_INTRA_THREADS=str(args.threads),
        ARGOS_BEAM_SIZE=str(beam),
    )
    package = work / "peer.argosmodel"
    attn("export", "--checkpoint", str(checkpoint), "--format", "argos", "--output", str(package))
    install = "import sys, argostranslate.package as p; p.install_from_path(sys.argv[1])"
    done = subprocess.run([str(python), "-c", install, str(package)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"installing the Argos package failed:\n{done.stderr[-3000:]}")
    argos_dir = home / "data" / "argos-translate"
    installed = next((argos_dir / "packages").glob("translate-*"))
    (home / "index").mkdir(parents=True, exist_ok=True)
    metadata = json.loads((installed / "metadata.json").read_text(encoding="utf-8"))
    (home / "index" / "index.json").write_text(json.dumps([metadata]), encoding="utf-8")
    codes = [argos_code(code) for code in languages]
    (argos_dir / "minisbd").mkdir(parents=True, exist_ok=True)
    for code in codes:
        (argos_dir / "minisbd" / f"{code}.onnx").write_bytes(minisbd_model(code))
    port = free_port()
    argv = [str(binary), "--host", "127.0.0.1", "--port", str(port), "--load-only", ",".join(codes)]
    argv += ["--disable-web-ui", "--disable-files-translation", "--threads", str(args.peer_http_threads)]
    log = work / "libretranslate.log"
    server = ServerProcess("LibreTranslate", argv, port, log, ready_path="/languages", env=env)
    return server, installed / "model" / "model.bin"


CT2_FASTAPI = '''"""The CTranslate2 + FastAPI server a CTranslate2 user writes: one translate_batch per request."""
import os
import sys

import ctranslate2
import sentencepiece
import uvicorn
from fastapi import FastAPI

model, port, threads, beam, length_penalty, max_length = sys.argv[1:7]
translator = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=int(threads))
tokenizer = os.path.join(model, "tokenizer")
joint = os.path.exists(os.path.join(tokenizer, "joint.model"))
source = sentencepiece.SentencePieceProcessor(
    model_file=os.path.join(tokenizer, "joint.model" if joint else "source.model")
)
target = source if joint else sentencepiece.SentencePieceProcessor(model_file=os.path.join(tokenizer, "target.model"))
app = FastAPI()


@app.post("/translate")
def translate(body: dict):
    pieces = source.encode(body["q"], out_type=str)
    result = translator.translate_batch(
        [pieces], beam_size=int(beam), length_penalty=float(length_penalty), max_decoding_length=int(max_length)
    )
    return {"translatedText": target.decode(result[0].hypotheses[0])}


@app.get("/health")
def health():
    return {"status": "ok"}


uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")
'''


def ct2_fastapi_server(args, work: Path, export_dir: Path, decode: dict) -> tuple[ServerProcess, Path]:
    script = work / "ct2_fastapi.py"
    script.write_text(CT2_FASTAPI, encoding="utf-8")
    port = free_port()
    argv = [sys.executable, str(script), str(export_dir), str(port), str(args.threads), str(decode["beam_size"])]
    argv += [str(decode["length_penalty"]), str(int(decode["max_len_b"]))]
    log = work / "ct2_fastapi.log"
    return ServerProcess("CTranslate2 + FastAPI", argv, port, log), export_dir / "model.bin"


# ---------------------------------------------------------------------------------------------
# Cells.


def attn_stats(health: dict) -> dict:
    return next(iter(health["models"].values()))


async def cell(server: ServerProcess, is_attn: bool, bodies: list[bytes], clients: int, args) -> dict:
    warmup = await run_load(
        server.port, bodies, clients, 60.0, args.warmup * clients, args.request_timeout, offset=len(bodies) // 2
    )
    before = attn_stats(get_json(server.port, "/health", timeout=10)) if is_attn else None
    rss_before, load_average = server.rss, os.getloadavg()[0]
    load = await run_load(server.port, bodies, clients, args.seconds, args.max_requests, args.request_timeout)
    rss_after = server.rss
    row = {
        "system": server.name,
        "clients": clients,
        "sent": load.sent,
        "answered": len(load.latencies),
        "wall_s": round(load.wall, 2),
        "sentences_per_s": round(len(load.latencies) / load.wall, 1),
        "p50_ms": ms(percentile(load.latencies, 50)),
        "p95_ms": ms(percentile(load.latencies, 95)),
        "p99_ms": ms(percentile(load.latencies, 99)),
        "refused_429": load.failures.get("429", 0),
        "errors": {key: count for key, count in load.failures.items() if key != "429"},
        "warmup_failures": warmup.failures,
        "rss_before_mb": rss_before,
        "rss_after_mb": rss_after,
        "client_cpu_pct": round(100 * load.cpu / load.wall, 1),
        "load_average_1m": round(load_average, 2),
    }
    if is_attn:
        after = attn_stats(get_json(server.port, "/health", timeout=10))
        delta = {key: after[key] - before[key] for key in ("requests", "sentences", "calls", "refused", "cancelled")}
        row["server"] = delta
        row["requests_per_call"] = round(delta["requests"] / delta["calls"], 2) if delta["calls"] else None
    return row


async def probe(server: ServerProcess, sentences: list[str], languages: tuple[str, str]) -> list[Optional[str]]:
    """The first sentences translated one by one (also the server's first requests)."""
    connection, found = Connection("127.0.0.1", server.port), []
    try:
        for sentence in sentences:
            body = json.dumps({"q": sentence, "source": languages[0], "target": languages[1]}, ensure_ascii=False)
            try:
                found.append((await post_translate(connection, body.encode("utf-8"), 60.0))[1])
            except Exception:
                connection.close()
                found.append(None)
    finally:
        connection.close()
    return found


def same_translation(a: Optional[str], b: Optional[str]) -> bool:
    """Equal once a final punctuation mark is set aside: LibreTranslate makes a translation end with
    the source's final mark (its improve_translation_formatting), so "。" becomes "."."""
    if a is None or b is None:
        return False
    strip = "".join(".。!！?？,，;；")
    return a.strip().rstrip(strip) == b.strip().rstrip(strip)


async def run_system(server: ServerProcess, is_attn: bool, bodies, probe_sentences, languages, args) -> dict:
    print(f"\n{server.name}: starting ({shlex.join(server.argv[:6])} …)", flush=True)
    server.start(args.start_timeout)
    system = {"name": server.name, "command": server.argv, "started_in_s": server.started_in}
    system["rss_start_mb"] = server.rss
    try:
        system["probe"] = await probe(server, probe_sentences, languages)
        system["rss_after_probe_mb"] = server.rss
        system["cells"] = []
        print(HEADER)
        for clients in args.concurrency:
            row = await cell(server, is_attn, bodies, clients, args)
            system["cells"].append(row)
            print(table_line(row), flush=True)
    finally:
        system["stop"] = server.stop(args.stop_timeout)
        print(f"  {system['stop']['note']}, exit status {system['stop']['exit_status']}", flush=True)
    return system


async def soak(server: ServerProcess, bodies: list[bytes], args) -> dict:
    print(f"\nsoak: {server.name}, {args.soak_clients} clients for {args.soak_seconds:g} s", flush=True)
    server.start(args.start_timeout)
    result = {"system": server.name, "clients": args.soak_clients, "seconds": args.soak_seconds}
    try:
        result["rss_loaded_mb"] = server.rss
        warm = await run_load(
            server.port, bodies, args.soak_clients, args.soak_warmup, 10**9, args.request_timeout, len(bodies) // 2
        )
        result["warmup"] = {"seconds": args.soak_warmup, "answered": len(warm.latencies), "failures": warm.failures}
        before = attn_stats(get_json(server.port, "/health", timeout=10))
        result["rss_start_mb"] = server.rss
        samples = []

        async def sample():
            while True:
                await asyncio.sleep(args.soak_sample_seconds)
                samples.append(server.rss)

        sampler = asyncio.ensure_future(sample())
        try:
            load = await run_load(
                server.port, bodies, args.soak_clients, args.soak_seconds, args.soak_max_requests, args.request_timeout
            )
        finally:
            sampler.cancel()
        await asyncio.sleep(0.5)  # the access log's last lines, the last answers' garbage
        result["rss_end_mb"] = server.rss
        after = attn_stats(get_json(server.port, "/health", timeout=10))
        accepted = after["requests"] - before["requests"]
        errors = {key: count for key, count in load.failures.items() if key != "429"}
        result.update(
            sent=load.sent,
            answered=len(load.latencies),
            wall_s=round(load.wall, 2),
            sentences_per_s=round(len(load.latencies) / load.wall, 1),
            p50_ms=ms(percentile(load.latencies, 50)),
            p95_ms=ms(percentile(load.latencies, 95)),
            p99_ms=ms(percentile(load.latencies, 99)),
            refused_429=load.failures.get("429", 0),
            errors_other_than_429=errors,
            server=dict(
                accepted=accepted,
                refused=after["refused"] - before["refused"],
                cancelled=after["cancelled"] - before["cancelled"],
                calls=after["calls"] - before["calls"],
                queued_at_end=after["queued_sentences"],
            ),
            rss_samples_mb=samples,
            rss_peak_mb=max([s for s in samples + [result["rss_start_mb"], result["rss_end_mb"]] if s is not None]),
        )
        growth = result["rss_end_mb"] - result["rss_start_mb"]
        result["rss_growth_mb"] = round(growth, 1)
        result["checks"] = {
            "no_errors_other_than_429": not errors,
            "every_accepted_request_answered": accepted == len(load.latencies) and after["queued_sentences"] == 0,
            f"rss_within_{SOAK_RSS_LIMIT_MB:g}_mb": abs(growth) <= SOAK_RSS_LIMIT_MB,
        }
    finally:
        result["stop"] = server.stop(args.stop_timeout)
    result["checks"]["exit_status_0"] = result["stop"]["exit_status"] == 0
    return result


# ---------------------------------------------------------------------------------------------
# The mixed load: short requests beside long ones, the bounds on one request, SIGTERM under load.


def long_request(long: list[str], lines: int, languages: tuple[str, str], beam: int) -> bytes:
    """A /v1 request of `lines` long sentences at beam `beam`: what a heavy client sends."""
    q = [long[i % len(long)] for i in range(lines)]
    body = {"q": q, "source": languages[0], "target": languages[1], "beam_size": beam}
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


async def long_clients(port: int, body: bytes, clients: int, seconds: float, timeout: float, pause: float) -> dict:
    """`clients` clients sending `body` to /v1/translate until `seconds` have passed, each waiting
    `pause` seconds after a 429 before it tries again; the statuses and the seconds of the 200s."""
    statuses: dict[str, int] = {}
    answered: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        connection = Connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                begun = time.perf_counter()
                try:
                    status, _ = await asyncio.wait_for(connection.request("POST", "/v1/translate", body), timeout)
                    key = str(status)
                except Exception as error:
                    connection.close()
                    key = type(error).__name__
                statuses[key] = statuses.get(key, 0) + 1
                if key == "200":
                    answered.append(time.perf_counter() - begun)
                elif key == "429":
                    await asyncio.sleep(pause)
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return {"statuses": statuses, "median_s": round(percentile(answered, 50), 2) if answered else None}


def load_summary(load: Load) -> dict:
    return {
        "answered": len(load.latencies),
        "sentences_per_s": round(len(load.latencies) / load.wall, 1),
        "p50_ms": ms(percentile(load.latencies, 50)),
        "p95_ms": ms(percentile(load.latencies, 95)),
        "statuses": {"200": len(load.latencies), **load.failures},
    }


async def idle(server: ServerProcess, seconds: float) -> bool:
    """Wait until the server has nothing queued or decoding (by /health), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if attn_stats(get_json(server.port, "/health", timeout=10))["queued_sentences"] == 0:
                return True
        except OSError:  # 503: not ready yet
            pass
        await asyncio.sleep(0.5)
    return False


async def behind(server: ServerProcess, heavy: bytes, short: bytes, args) -> dict:
    """`heavy` sent to /v1/translate, then one second later a short request: the status and seconds of each."""
    heavy_connection, short_connection = Connection("127.0.0.1", server.port), Connection("127.0.0.1", server.port)

    async def timed(connection, path, body):
        begun = time.perf_counter()
        try:
            status, _ = await asyncio.wait_for(connection.request("POST", path, body), args.request_timeout)
        except Exception as error:
            status = type(error).__name__
        return status, round(time.perf_counter() - begun, 2)

    try:
        first = asyncio.ensure_future(timed(heavy_connection, "/v1/translate", heavy))
        await asyncio.sleep(1.0)
        short_status, short_s = await timed(short_connection, "/translate", short)
        heavy_status, heavy_s = await first
    finally:
        heavy_connection.close()
        short_connection.close()
    return {"heavy": {"status": heavy_status, "s": heavy_s}, "short": {"status": short_status, "s": short_s}}


async def mixed(server: ServerProcess, short: list[bytes], heavy: bytes, probes: dict, args) -> dict:
    """The mixed-load scenario on a fresh server: the short load alone, then beside the long clients;
    memory before, during and after; the probes (a request and a short one a second later); and
    SIGTERM with the mixed load in flight."""
    print(f"\nmixed load: {server.name}", flush=True)
    server.start(args.start_timeout)
    result = {"system": server.name, "seconds": args.mixed_seconds}
    clients, seconds, timeout = args.mixed_short_clients, args.mixed_seconds, args.request_timeout
    try:
        await run_load(server.port, short, clients, 60.0, args.warmup * clients, timeout, offset=len(short) // 2)
        await long_clients(server.port, heavy, 1, 0.1, timeout, 1.0)  # one long request, untimed
        result["rss_start_mb"] = server.rss
        result["short_alone"] = load_summary(
            await run_load(server.port, short, clients, seconds, args.max_requests, timeout)
        )
        result["rss_before_mb"] = server.rss
        samples = []

        async def sample():
            while True:
                await asyncio.sleep(1.0)
                samples.append(server.rss)

        sampler = asyncio.ensure_future(sample())
        try:
            short_load, heavy_load = await asyncio.gather(
                run_load(server.port, short, clients, seconds, args.max_requests, timeout),
                long_clients(server.port, heavy, args.mixed_long_clients, seconds, timeout, 1.0),
            )
        finally:
            sampler.cancel()
        result["short_beside_long"] = load_summary(short_load)
        result["long"] = heavy_load
        result["rss_peak_mb"] = max([m for m in samples if m is not None], default=None)
        result["idle_after"] = await idle(server, 120.0)
        await asyncio.sleep(2.0)
        result["rss_after_mb"] = server.rss
        result["probes"] = {name: await behind(server, body, short[0], args) for name, body in probes.items()}
        # SIGTERM while the mixed load is in flight.
        loads = asyncio.ensure_future(
            asyncio.gather(
                run_load(server.port, short, clients, 10.0, args.max_requests, timeout),
                long_clients(server.port, heavy, args.mixed_long_clients, 10.0, timeout, 1.0),
                return_exceptions=True,
            )
        )
        await asyncio.sleep(3.0)
        result["sigterm_under_load"] = await asyncio.to_thread(server.stop, args.stop_timeout)
        await loads
    finally:
        if server.process is not None and server.process.poll() is None:
            result.setdefault("stop", server.stop(args.stop_timeout))
    alone, beside = result["short_alone"]["p95_ms"], result["short_beside_long"]["p95_ms"]
    statuses = {**result["short_beside_long"]["statuses"], **result["long"]["statuses"]}
    stopped = result["sigterm_under_load"]
    result["checks"] = {
        "short_p95_within_3x": None if not alone or beside is None else beside <= 3 * alone,
        "only_200_and_429": set(result["short_beside_long"]["statuses"]) | set(result["long"]["statuses"])
        <= {"200", "429"},
        "rss_within_50_mb_after": None
        if None in (result["rss_after_mb"], result["rss_start_mb"])
        else abs(result["rss_after_mb"] - result["rss_start_mb"]) <= SOAK_RSS_LIMIT_MB,
        "probes_short_within_2_s": all(
            p["short"]["status"] == 200 and p["short"]["s"] <= 2.0 for p in result["probes"].values()
        ),
        "sigterm_exit_0_within_15_s": stopped["exit_status"] == 0 and stopped["stopped_in_s"] <= 15,
    }
    result["statuses"] = statuses
    return result


def mixed_line(result: dict) -> str:
    alone, beside, heavy = result["short_alone"], result["short_beside_long"], result["long"]
    return (
        f"{result['system']}: short p50/p95 {alone['p50_ms']}/{alone['p95_ms']} ms alone, "
        f"{beside['p50_ms']}/{beside['p95_ms']} ms beside {heavy['statuses']} long requests "
        f"(median {heavy['median_s']} s); short statuses {beside['statuses']}; RSS {result['rss_start_mb']} → "
        f"{result['rss_before_mb']} → peak {result['rss_peak_mb']} → {result['rss_after_mb']} MB; "
        f"probes {json.dumps(result['probes'])}; SIGTERM under load: exit {result['sigterm_under_load']['exit_status']}"
        f" in {result['sigterm_under_load'].get('stopped_in_s')} s\n  checks: {json.dumps(result['checks'])}"
    )


# ---------------------------------------------------------------------------------------------
# Report.

HEADER = (
    f"{'system':<34} {'clients':>7} {'sent/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'200s':>6} "
    f"{'429':>4} {'errors':>6} {'RSS MB before → after':>22} {'req/call':>8} {'client CPU':>10}"
)


def table_line(row: dict) -> str:
    def number(value):
        return "-" if value is None else f"{value:.1f}"

    errors = sum(row["errors"].values())
    memory = f"{number(row['rss_before_mb'])} → {number(row['rss_after_mb'])}"
    per_call = row.get("requests_per_call")
    return (
        f"{row['system']:<34} {row['clients']:>7} {row['sentences_per_s']:>8.1f} {number(row['p50_ms']):>8} "
        f"{number(row['p95_ms']):>8} {number(row['p99_ms']):>8} {row['answered']:>6} {row['refused_429']:>4} "
        f"{errors:>6} {memory:>22} {'-' if per_call is None else f'{per_call:.2f}':>8} {row['client_cpu_pct']:>9.0f}%"
    )


def markdown(rows: list[dict]) -> str:
    lines = [
        "| system | clients | sentences/s | p50 ms | p95 ms | p99 ms | 200s | 429s | other errors "
        "| server RSS MB before → after | requests per decoding call | client CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        errors = ", ".join(f"{key}: {count}" for key, count in row["errors"].items()) or "0"
        per_call = row.get("requests_per_call")
        lines.append(
            f"| {row['system']} | {row['clients']} | {row['sentences_per_s']:,.1f} | {row['p50_ms']} | "
            f"{row['p95_ms']} | {row['p99_ms']} | {row['answered']:,} | {row['refused_429']} | {errors} | "
            f"{row['rss_before_mb']} → {row['rss_after_mb']} | {'–' if per_call is None else per_call} | "
            f"{row['client_cpu_pct']:.0f}% |"
        )
    return "\n".join(lines)


def comparisons(systems: dict, clients: int) -> dict:
    """At `clients` clients: attn batching over one at a time, per backend; attn batching against the peer."""

    def at(key):
        system = systems.get(key)
        return next((r for r in system["cells"] if r["clients"] == clients), None) if system else None

    found = {}
    for backend in ("pytorch", "int8"):
        batching, single = at(backend), at(f"{backend}-single")
        if batching and single and single["sentences_per_s"]:
            ratio = batching["sentences_per_s"] / single["sentences_per_s"]
            found[f"{backend}_batching_over_one_at_a_time"] = {
                "ratio": round(ratio, 2),
                "at_least_3x": ratio >= 3,
                "p95_ms": [batching["p95_ms"], single["p95_ms"]],
            }
        peer = at("peer")
        if batching and peer and peer["sentences_per_s"]:
            ratio = batching["sentences_per_s"] / peer["sentences_per_s"]
            p95_ok = None if None in (batching["p95_ms"], peer["p95_ms"]) else batching["p95_ms"] <= peer["p95_ms"]
            found[f"{backend}_batching_over_peer"] = {
                "ratio": round(ratio, 2),
                "at_least_as_many": ratio >= 1,
                "p95_ms": [batching["p95_ms"], peer["p95_ms"]],
                "p95_no_worse": p95_ok,
            }
    return found


def versions(args) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("attn-cli", "torch", "ctranslate2", "fastapi", "uvicorn", "starlette", "sentencepiece"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    python = Path(args.libretranslate).parent / "python"
    if "peer" in args.systems and args.peer == "libretranslate" and python.is_file():
        query = (
            "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
            "('libretranslate', 'argos-translate-lt', 'ctranslate2', 'waitress', 'flask')}))"
        )
        done = subprocess.run([str(python), "-c", query], capture_output=True, text=True)
        found["peer"] = json.loads(done.stdout) if done.returncode == 0 else done.stderr[-500:]
    return found


# ---------------------------------------------------------------------------------------------


SMOKE = (
    "attn's own servers only (PyTorch and CTranslate2 int8, batching) on a tiny run: 1 and 4 clients for "
    "1.5 s each, a 2 s soak of 8 clients; LibreTranslate is reported, not started"
)


def parse_args():
    arguments = parser(__doc__, SMOKE)
    arguments.add_argument("--run", type=Path, help="the trained run (its test split); default runs/en-zh")
    arguments.add_argument(
        "--model", type=Path, help="an `attn export` directory for the int8 rows (default: export it)"
    )
    arguments.add_argument("--concurrency", default="1,4,16,64", help="clients per cell, comma-separated")
    arguments.add_argument("--seconds", type=float, default=10.0, help="the length of each timed cell")
    arguments.add_argument("--max-requests", type=int, default=20000, help="requests per timed cell at most")
    arguments.add_argument("--warmup", type=int, default=2, help="untimed requests per client before each cell")
    arguments.add_argument("--systems", default=",".join(SYSTEMS), help=f"which of {', '.join(SYSTEMS)}")
    arguments.add_argument("--peer", choices=("libretranslate", "ct2-fastapi"), default="libretranslate")
    arguments.add_argument("--device", default="cpu", help="where attn serve decodes: cpu, or cuda")
    arguments.add_argument(
        "--libretranslate", default=shutil.which("libretranslate") or "/tmp/lt-venv/bin/libretranslate"
    )
    arguments.add_argument("--peer-http-threads", type=int, default=4, help="LibreTranslate's --threads (its default)")
    arguments.add_argument(
        "--threads", type=int, default=1, help="each server's compute threads (torch or CTranslate2)"
    )
    arguments.add_argument("--decode", choices=("peer", "run"), default="peer", help="whose decoding settings")
    arguments.add_argument("--serve-args", default="", help="more `attn serve` flags, e.g. '--max-wait-ms 2'")
    arguments.add_argument("--long-words", type=int, default=25)
    arguments.add_argument("--long-every", type=int, default=10, help="every Nth request is a long sentence")
    arguments.add_argument("--probe", type=int, default=20, help="sentences translated one by one to compare outputs")
    arguments.add_argument("--request-timeout", type=float, default=60.0)
    arguments.add_argument("--start-timeout", type=float, default=180.0)
    arguments.add_argument("--stop-timeout", type=float, default=60.0)
    arguments.add_argument("--soak-seconds", type=float, default=60.0, help="0: no soak")
    arguments.add_argument("--soak-warmup", type=float, default=10.0)
    arguments.add_argument("--soak-clients", type=int, default=64)
    arguments.add_argument("--soak-max-requests", type=int, default=500000)
    arguments.add_argument("--soak-sample-seconds", type=float, default=5.0)
    arguments.add_argument("--mixed-seconds", type=float, default=20.0, help="each phase of the mixed load; 0: none")
    arguments.add_argument("--mixed-systems", default="int8,pytorch", help="which attn servers get the mixed load")
    arguments.add_argument("--mixed-short-clients", type=int, default=16)
    arguments.add_argument("--mixed-long-clients", type=int, default=2)
    arguments.add_argument("--mixed-long-lines", type=int, default=128, help="long sentences per long request")
    arguments.add_argument("--max-beam", type=int, default=16, help="the beam of the long requests (the server's most)")
    arguments.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "attn-bench",
        help="the models, logs and package go to its http/ folder, made afresh (smoke: the tiny run goes to tiny/)",
    )
    args = arguments.parse_args()
    if args.smoke:
        args.run = args.run or tiny_run(args.workdir / "tiny")
        args.concurrency, args.seconds, args.max_requests, args.warmup = "1,4", 1.5, 1000, 1
        args.systems, args.probe = "pytorch,int8", 3
        args.soak_seconds, args.soak_warmup, args.soak_clients, args.soak_sample_seconds = 2.0, 0.5, 8, 0.5
        args.mixed_seconds, args.mixed_systems, args.mixed_short_clients, args.mixed_long_lines = 2.0, "int8", 4, 8
        args.start_timeout, args.stop_timeout, args.request_timeout = 120.0, 30.0, 30.0
    args.run = args.run or Path("runs/en-zh")
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.mixed_systems = [s.strip() for s in args.mixed_systems.split(",") if s.strip()]
    unknown = (set(args.systems) | set(args.mixed_systems)) - set(SYSTEMS)
    if "peer" in args.mixed_systems:
        arguments.error("--mixed-systems: attn's servers only; the peer takes no beam or lines in one request")
    if unknown:
        arguments.error(f"--systems: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}")
    return args


async def bench(args, work: Path) -> dict:
    import torch

    from attn_cli.checkpoint import find_checkpoint
    from attn_cli.paths import RunPaths

    # The decoding settings, written into a copy of the checkpoint (and of the export below).
    checkpoint = find_checkpoint(args.run, None)
    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    languages = (payload["config"]["data"]["src_lang"], payload["config"]["data"]["tgt_lang"])
    run_decode = {key: payload["config"]["decode"][key] for key in PEER_DECODE}
    if args.decode == "peer":
        decode = dict(PEER_DECODE)
        served_checkpoint = work / "checkpoint.pt"
        payload["config"]["decode"].update(decode)
        payload["training_state"] = {}
        torch.save(payload, served_checkpoint)
        pytorch_what = ["--checkpoint", str(served_checkpoint)]
    else:
        decode, served_checkpoint, pytorch_what = dict(run_decode), checkpoint, ["--run", str(args.run)]
    del payload

    test_file = RunPaths.of(args.run).split_file("test", languages[0])
    test = [line.strip() for line in test_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    long = long_sentences(test, args.long_words)
    mix = request_mix(test, long, args.long_every)
    bodies = [
        json.dumps({"q": s, "source": languages[0], "target": languages[1]}, ensure_ascii=False).encode("utf-8")
        for s in mix
    ]

    export_dir = work / "int8"
    if {"int8", "int8-single"} & set(args.systems + args.mixed_systems) or (
        "peer" in args.systems and args.peer == "ct2-fastapi"
    ):
        if args.model is not None:
            shutil.copytree(args.model, export_dir)
        else:
            print(f"exporting {served_checkpoint} (int8) to {export_dir}", flush=True)
            attn("export", "--checkpoint", str(served_checkpoint), "--output", str(export_dir))
        set_export_decode(export_dir, decode)
    extra = shlex.split(args.serve_args)

    results = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            **machine_info(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        },
        "versions": versions(args),
        "settings": {
            "run": str(args.run),
            "checkpoint": str(checkpoint),
            "model": str(args.model) if args.model else None,
            "decode": {"chosen": args.decode, "attn": decode, "run": run_decode},
            "threads": args.threads,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "max_requests": args.max_requests,
            "warmup_requests_per_client": args.warmup,
            "request_timeout_s": args.request_timeout,
            "serve_args": extra,
            "peer": args.peer,
            "peer_http_threads": args.peer_http_threads if args.peer == "libretranslate" else None,
            "sentences": {
                "test": len(test),
                "long": len(long),
                "long_words_at_least": args.long_words,
                "long_every": args.long_every,
                "mix": len(mix),
                "mean_words": round(sum(len(s.split()) for s in mix) / len(mix), 1),
            },
        },
        "systems": {},
        "rows": [],
    }

    makers = {
        "pytorch": lambda: attn_server("attn pytorch, batching", pytorch_what, True, args, work, extra),
        "pytorch-single": lambda: attn_server("attn pytorch, one at a time", pytorch_what, False, args, work, extra),
        "int8": lambda: attn_server("attn ct2 int8, batching", ["--model", str(export_dir)], True, args, work, extra),
        "int8-single": lambda: attn_server(
            "attn ct2 int8, one at a time", ["--model", str(export_dir)], False, args, work, extra
        ),
    }
    probe_sentences = test[: args.probe]
    missing = peer_missing(args)
    skipped = "not among --systems (smoke mode measures attn alone)" if args.smoke else "not among --systems"
    results["peer"] = {
        "name": PEER_NAMES[args.peer],
        "available": missing is None,
        "measured": "peer" in args.systems and missing is None,
        "note": missing or ("" if "peer" in args.systems else skipped),
    }
    for key in [s for s in SYSTEMS if s in args.systems]:
        if key == "peer" and missing is not None:
            print(f"\npeer: {PEER_NAMES[args.peer]} is unavailable, skipped: {missing}", flush=True)
            results["systems"][key] = {"name": PEER_NAMES[args.peer], "key": key, "unavailable": True}
            results["systems"][key].update(error=missing, cells=[])
            continue
        try:
            if key == "peer" and args.peer == "libretranslate":
                server, model_bin = libretranslate_server(args, work, served_checkpoint, languages, decode["beam_size"])
            elif key == "peer":
                server, model_bin = ct2_fastapi_server(args, work, export_dir, decode)
            else:
                server = makers[key]()
            if key == "peer" and export_dir.exists():
                same = sha256(model_bin) == sha256(export_dir / "model.bin")
                results["settings"]["peer_model_bin_same_as_attn_int8"] = same
            system = await run_system(server, key != "peer", bodies, probe_sentences, languages, args)
        except RuntimeError as error:  # it could not be set up or did not start: the others still run
            print(f"\n{key}: {error}", flush=True)
            results["systems"][key] = {"name": key, "key": key, "error": str(error), "cells": []}
            continue
        system["key"] = key
        results["systems"][key] = system
        results["rows"] += system["cells"]

    reference = results["systems"].get("peer") or results["systems"].get("pytorch")
    if reference and "probe" in reference:
        for system in [s for s in results["systems"].values() if "probe" in s]:
            same = sum(same_translation(a, b) for a, b in zip(system["probe"], reference["probe"]))
            system["probe_same_as"] = {"system": reference["name"], "same": same, "of": len(reference["probe"])}

    comparison_clients = 16 if 16 in args.concurrency else max(args.concurrency)
    results["comparisons"] = {"clients": comparison_clients, **comparisons(results["systems"], comparison_clients)}
    if args.mixed_seconds > 0:
        short = [
            json.dumps({"q": s, "source": languages[0], "target": languages[1]}, ensure_ascii=False).encode("utf-8")
            for s in test
        ]
        heavy = long_request(long, args.mixed_long_lines, languages, args.max_beam)
        # The two requests of the issue: an output length past every bound, and four lines of
        # nearly 2,000 characters at the widest beam.
        pages = long_sentences(long, 300)[:4]
        probes = {
            "max_len_b_100000": json.dumps(
                {"q": "I love it", "source": languages[0], "target": languages[1], "max_len_b": 100000}
            ).encode("utf-8"),
            "four_long_lines_at_max_beam": json.dumps(
                {
                    "q": [page[:1990] for page in pages],
                    "source": languages[0],
                    "target": languages[1],
                    "beam_size": args.max_beam,
                },
                ensure_ascii=False,
            ).encode("utf-8"),
        }
        results["mixed"] = []
        for key in [s for s in SYSTEMS if s in args.mixed_systems]:
            server = makers[key]()
            server.name += " (mixed load)"
            try:
                results["mixed"].append(await mixed(server, short, heavy, probes, args))
            except RuntimeError as error:
                print(f"  {error}", flush=True)
                results["mixed"].append({"system": server.name, "error": str(error)})
            print(mixed_line(results["mixed"][-1]) if "checks" in results["mixed"][-1] else "", flush=True)
    if args.soak_seconds > 0:
        server = attn_server("attn pytorch, batching (soak)", pytorch_what, True, args, work, extra)
        try:
            results["soak"] = await soak(server, bodies, args)
        except RuntimeError as error:
            print(f"  {error}", flush=True)
            results["soak"] = {"system": server.name, "error": str(error)}
    results["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    return results


def report(results: dict) -> None:
    print("\n" + markdown(results["rows"]))
    comparisons = results["comparisons"]
    print(f"\nat {comparisons['clients']} clients:")
    for key, found in comparisons.items():
        if key != "clients":
            print(f"  {key}: {json.dumps(found)}")
    peer = results["peer"]
    if "peer" not in results["systems"]:
        available = "available" if peer["available"] else f"unavailable: {peer['note']}"
        print(f"  peer {peer['name']}: not measured ({'not among --systems' if peer['available'] else available})")
    for system in results["systems"].values():
        if "error" in system:
            print(f"  {system['name']}: did not run: {system['error'].splitlines()[0]}")
            continue
        same = system.get("probe_same_as")
        stop = system["stop"]
        print(
            f"  {system['name']}: started in {system['started_in_s']} s, RSS {system['rss_start_mb']} MB at start; "
            f"exit status {stop['exit_status']} ({stop['note']})"
            + (f"; probe: {same['same']} of {same['of']} as {same['system']}" if same else "")
        )
    for found in results.get("mixed", []):
        print("\nmixed load, " + (mixed_line(found) if "checks" in found else f"did not run: {found['error']}"))
    soak = results.get("soak")
    if soak and "error" in soak:
        print(f"\nsoak: did not run: {soak['error'].splitlines()[0]}")
    elif soak:
        server = soak["server"]
        print(
            f"\nsoak, {soak['clients']} clients for {soak['seconds']:g} s: {soak['answered']:,} answered "
            f"({soak['sentences_per_s']} sentences/s, p95 {soak['p95_ms']} ms), {soak['refused_429']} 429s, "
            f"other errors {soak['errors_other_than_429'] or 0}; the server accepted {server['accepted']:,}, "
            f"cancelled {server['cancelled']}; RSS {soak['rss_start_mb']} → {soak['rss_end_mb']} MB "
            f"(peak {soak['rss_peak_mb']}); exit status {soak['stop']['exit_status']}"
        )
        print(f"  checks: {json.dumps(soak.get('checks'))}")


def main() -> None:
    args = parse_args()
    work = args.workdir / "http"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    results = asyncio.run(bench(args, work))
    report(results)
    write_report(args.json, results, args)


if __name__ == "__main__":
    main()
