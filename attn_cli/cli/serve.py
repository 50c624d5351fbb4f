"""`attn serve`: trained models behind HTTP, for the clients of the LibreTranslate API, attn's own
/v1 API and a page that shows the attention."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import DeviceOption, tell
from attn_cli.cli.decoding_flags import ThreadsOption
from attn_cli.errors import UserError


def serve(
    run: Optional[List[Path]] = typer.Option(
        None, "--run", help="Run directory to serve (its best checkpoint); repeat for several language pairs."
    ),
    checkpoint: Optional[List[Path]] = typer.Option(None, "--checkpoint", help="Checkpoint file to serve; repeatable."),
    model: Optional[List[Path]] = typer.Option(
        None, "--model", "-m", help="A directory `attn export` wrote (decoded by CTranslate2); repeatable."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; 0.0.0.0 for every interface."),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="Port to listen on."),
    api_keys: Optional[Path] = typer.Option(
        None, "--api-keys", help="File of API keys, one a line: requests without one of them get 403."
    ),
    cors_origin: Optional[List[str]] = typer.Option(
        None, "--cors-origin", help="Let pages from this origin call the server (e.g. https://example.org); repeatable."
    ),
    batching: bool = typer.Option(
        True, "--batching/--no-batching", help="Decode concurrent requests together (off: one at a time)."
    ),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", min=0, help="How long an idle model worker waits for more requests to batch."
    ),
    max_sentences: int = typer.Option(128, "--max-sentences", min=1, help="Sentences (lines) per request."),
    max_characters: int = typer.Option(2000, "--max-characters", min=1, help="Characters per sentence."),
    max_beam: int = typer.Option(16, "--max-beam", min=1, help="The widest beam_size (and n_best) a request may ask."),
    max_output_tokens: int = typer.Option(
        512, "--max-output-tokens", min=1, help="The largest max_len_b a request may ask (output tokens)."
    ),
    max_attention_sentences: int = typer.Option(
        16, "--max-attention-sentences", min=1, help="Sentences per request that asks for attention or alignment."
    ),
    max_terms: int = typer.Option(256, "--max-terms", min=0, help="Glossary terms per request."),
    queue: int = typer.Option(2048, "--queue", min=1, help="Sentences waiting per model before requests get 429."),
    queue_work: int = typer.Option(
        120_000,
        "--queue-work",
        min=1,
        help="Work waiting per model (source tokens x beam) before requests get 429.",
    ),
    turn_work: int = typer.Option(
        600,
        "--turn-work",
        min=1,
        help="Work (source tokens x beam) in one decoding call: a longer request goes in turns with others.",
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        min=0.1,
        help="Seconds a request may wait for its decoding to begin (then 503).",
    ),
    shutdown_grace: float = typer.Option(
        10.0, "--shutdown-grace", min=0, help="Seconds SIGTERM gives accepted requests before the process exits."
    ),
    device: str = DeviceOption,
    threads: Optional[int] = ThreadsOption,
) -> None:
    """Serve models over HTTP: the LibreTranslate API (POST /translate, GET /languages, POST /detect),
    attn's own API (POST /v1/translate with decoding options, scores, alignment and attention;
    GET /v1/models, GET /health; docs at /docs), and a page at / that translates and shows the
    three attentions. Each --run, --checkpoint or --model serves one language pair.
    Needs the serve extra: pip install "attn-cli\\[serve]".

    Example:

      attn serve --run runs/en-zh

      attn serve --model exported/en-zh-int8 --port 5000 --api-keys keys.txt

      curl -s localhost:8000/translate -d q=Hello -d source=en -d target=zh
    """
    try:
        import uvicorn

        from attn_cli.serving.app import create_app
        from attn_cli.serving.models import ServedModels
        from attn_cli.serving.server import Limits, Server
    except ImportError as error:
        raise UserError(f"attn serve needs the serve extra ({error.name} is missing): pip install 'attn-cli[serve]'")
    from attn_cli.engines.load import load_engine

    keys = _read_keys(api_keys) if api_keys is not None else None
    engines = [load_engine([path], [], None, device, threads) for path in run or []]
    engines += [load_engine([], [path], None, device, threads) for path in checkpoint or []]
    engines += [load_engine([], [], path, device, threads) for path in model or []]
    if not engines:
        engines = [load_engine([], [], None, device, threads)]
    limits = Limits(
        max_sentences=max_sentences,
        max_characters=max_characters,
        max_beam=max_beam,
        max_output_tokens=max_output_tokens,
        max_attention_sentences=max_attention_sentences,
        max_terms=max_terms,
        timeout=timeout,
        shutdown_grace=shutdown_grace,
        queue_sentences=queue,
        queue_work=queue_work,
        turn_work=turn_work,
        max_wait=max_wait_ms / 1000,
        batching=batching,
    )
    server = Server(ServedModels(engines), limits, keys)
    for served in server.models:
        tell(f"serving {served.name} ({served.backend}) from {served.engine.paths[0]}")
    _log_requests()
    tell(f"page at http://{host}:{port}/, API docs at http://{host}:{port}/docs; Ctrl-C stops")
    config = uvicorn.Config(
        create_app(server, cors_origin),
        host=host,
        port=port,
        access_log=False,  # one line per request is RequestGuard's
        timeout_graceful_shutdown=max(1, round(shutdown_grace)),  # SIGTERM: accepted requests first, so long
        log_level="warning",
    )
    # uvicorn stops on SIGTERM or SIGINT once every accepted request is answered, then raises the
    # signal again for the handler that was there before it: this one, so that the exit status is 0.
    stopped_by = []
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda number, frame: stopped_by.append(number))
    uvicorn.Server(config).run()
    if stopped_by:
        tell(f"stopped by {signal.Signals(stopped_by[0]).name}")


def _read_keys(path: Path) -> frozenset[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UserError(f"--api-keys {path}: cannot read it ({error.strerror})") from None
    keys = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise UserError(f"--api-keys {path}: no keys in it; write one key a line")
    return keys


def _log_requests() -> None:
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger = logging.getLogger("attn.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
