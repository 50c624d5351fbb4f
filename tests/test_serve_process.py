"""`attn serve` as a user runs it: a process on a loopback port that the `libretranslatepy` client
speaks to unchanged, that asks for keys from --api-keys, logs one line per request, and on SIGTERM
answers every request it accepted before it exits 0."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest
from support.serving import SENTENCES, reference, server_of

pytestmark = pytest.mark.slow  # starts attn serve processes

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def expected(served_checkpoint):
    return [t.text for t in reference(server_of(served_checkpoint), SENTENCES)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(*args: str, log=None):
    """`attn serve ARGS` on a free loopback port, up within 60 s; yields (url, process)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "attn_cli", "serve", "--port", str(port), "--device", "cpu", "--threads", "1", *args],
        stdout=subprocess.DEVNULL,
        stderr=log if log is not None else subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "health", timeout=2).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"attn serve did not start (exit status {process.poll()})") from None
                time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def post(url: str, body: dict, timeout: float = 60):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, json.loads(answer.read())


def test_libretranslatepy_translates_as_attn_translate_does(served_checkpoint, expected):
    from libretranslatepy import LibreTranslateAPI

    with serving("--checkpoint", str(served_checkpoint)) as (url, _):
        client = LibreTranslateAPI(url)
        assert [client.translate(sentence, "en", "zh") for sentence in SENTENCES] == expected
        assert client.translate(SENTENCES[0], "auto", "zh") == expected[0]
        assert client.languages() == [
            {"code": "en", "name": "English", "targets": ["zh"]},
            {"code": "zh", "name": "Chinese", "targets": []},
        ]
        assert client.detect("hello")[0]["language"] == "en"


def test_api_keys_from_a_file(served_checkpoint, expected, tmp_path):
    from libretranslatepy import LibreTranslateAPI

    keys = tmp_path / "keys.txt"
    keys.write_text("# one key a line\nsecret-1\n\nsecret-2\n")
    with serving("--checkpoint", str(served_checkpoint), "--api-keys", str(keys)) as (url, _):
        assert LibreTranslateAPI(url, api_key="secret-2").translate(SENTENCES[0], "en", "zh") == expected[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            LibreTranslateAPI(url).translate(SENTENCES[0], "en", "zh")
        assert refused.value.code == 403
        assert "API key" in json.loads(refused.value.read())["error"]


def test_sigterm_answers_every_accepted_request_and_exits_0(served_checkpoint, tmp_path):
    log_path = tmp_path / "serve.log"
    requests = 12
    with (
        open(log_path, "w") as log,
        serving("--checkpoint", str(served_checkpoint), "--max-wait-ms", "300", log=log) as (
            url,
            process,
        ),
    ):
        answers = [None] * requests

        def send(index):
            answers[index] = post(url + "v1/translate", {"q": SENTENCES[index % 4], "beam_size": 8})

        threads = [threading.Thread(target=send, args=(index,)) for index in range(requests)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until every request is accepted
            health = json.loads(urllib.request.urlopen(url + "health", timeout=5).read())
            if health["models"]["en-zh"]["requests"] == requests:
                break
            time.sleep(0.005)
        unanswered = sum(answer is None for answer in answers)
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=60)
        assert process.wait(timeout=60) == 0
    assert unanswered > 0, "SIGTERM came after every answer: the test proved nothing"
    assert [answer[0] for answer in answers] == [200] * requests
    assert all(answer[1]["translations"][0]["sentences"] for answer in answers)
    lines = [line for line in log_path.read_text().splitlines() if '"POST /v1/translate"' in line]
    assert len(lines) == requests and all(" 200 " in line for line in lines), "one access-log line per request"


def test_the_command_refuses_bad_setup_in_one_line(served_checkpoint, tmp_path):
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    runner = CliRunner()
    missing = runner.invoke(
        app, ["serve", "--checkpoint", str(served_checkpoint), "--api-keys", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2 and "--api-keys" in missing.output and "cannot read" in missing.output
    (tmp_path / "empty").write_text("# nothing\n")
    empty = runner.invoke(app, ["serve", "--checkpoint", str(served_checkpoint), "--api-keys", str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "no keys" in empty.output
    twice = runner.invoke(
        app, ["serve", "--checkpoint", str(served_checkpoint), "--checkpoint", str(served_checkpoint)]
    )
    assert twice.exit_code == 2 and "two models serve en-zh" in twice.output
