"""The model worker: concurrent requests are decoded together and answered as if alone; a full queue
answers 429; a request that timed out or whose client went away is dropped and holds up nobody."""

import asyncio
import dataclasses
import json

import pytest
from support.serving import SENTENCES, reference, server_of

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from attn_cli.serving.app import create_app  # noqa: E402


def _client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://attn")


async def _send_while_stopped(server, bodies, path="/translate", queued=None):
    """Send every body while the worker is not running, then start it: the requests queue up
    together, as concurrent ones do under load. `queued`: how many of them join the queue (all, unless
    some are refused as they arrive)."""
    async with _client(create_app(server)) as client:
        sent = [asyncio.ensure_future(client.post(path, json=body)) for body in bodies]
        while server.batchers["en-zh"].stats.requests < (len(bodies) if queued is None else queued):
            await asyncio.sleep(0.01)
        server.start()
        try:
            return await asyncio.gather(*sent)
        finally:
            server.stop()


@pytest.mark.parametrize("batching", [True, False])
@pytest.mark.slow  # clients in threads, a server's batching waits
def test_concurrent_requests_decode_together_and_answer_as_alone(served_checkpoint, batching):
    server = server_of(served_checkpoint, batching=batching, turn_work=10**6)  # one turn for all
    sentences = SENTENCES * 3
    answers = asyncio.run(_send_while_stopped(server, [{"q": s, "source": "en", "target": "zh"} for s in sentences]))
    alone = [reference(server, [sentence])[0].text for sentence in sentences]
    assert [answer.json()["translatedText"] for answer in answers] == alone
    stats = server.batchers["en-zh"].stats
    assert stats.requests == len(sentences)
    assert stats.calls == (1 if batching else len(sentences)), "batching on: one call; off: one per request"


def test_a_lone_client_is_answered_without_waiting_for_company(served_checkpoint):
    """The worker waits for more requests only while they come concurrently: with a wait longer
    than the test allows, one client's requests, sent one after another, are still answered."""
    server = server_of(served_checkpoint, max_wait=600, timeout=900)

    async def scenario():
        async with _client(create_app(server)) as client:
            server.start()
            try:
                return [
                    await asyncio.wait_for(client.post("/translate", json={"q": s, "source": "en", "target": "zh"}), 60)
                    for s in SENTENCES[:2]
                ]
            finally:
                server.stop()

    answers = asyncio.run(scenario())
    assert [a.json()["translatedText"] for a in answers] == [reference(server, [s])[0].text for s in SENTENCES[:2]]
    assert server.batchers["en-zh"].stats.calls == 2


def test_requests_with_other_options_are_decoded_apart(served_checkpoint):
    server = server_of(served_checkpoint)
    bodies = [{"q": SENTENCES[0], "beam_size": 1}, {"q": SENTENCES[1], "beam_size": 3}, {"q": SENTENCES[2]}]
    answers = asyncio.run(_send_while_stopped(server, bodies, "/v1/translate"))
    for body, answer in zip(bodies, answers):
        options = {k: v for k, v in body.items() if k != "q"}
        assert answer.json()["translations"][0]["translation"] == reference(server, [body["q"]], **options)[0].text
    assert server.batchers["en-zh"].stats.calls == 3


def test_a_bad_request_in_a_batch_fails_alone(served_checkpoint):
    server = server_of(served_checkpoint)
    too_long = "句子" * 200  # more target tokens than the model can output
    bodies = [{"q": SENTENCES[0]}, {"q": SENTENCES[1], "prefix": too_long}, {"q": SENTENCES[2]}]
    # The prefix is encoded as the request arrives: refused then, it never joins the others in the queue.
    answers = asyncio.run(_send_while_stopped(server, bodies, "/v1/translate", queued=2))
    assert [answer.status_code for answer in answers] == [200, 400, 200]
    assert "prefix" in answers[1].json()["error"]
    assert answers[2].json()["translations"][0]["translation"] == reference(server, [SENTENCES[2]])[0].text
    assert server.batchers["en-zh"].stats.requests == 2


def test_a_request_that_fails_in_the_decoding_call_fails_alone(served_checkpoint, monkeypatch):
    """A request whose decoding fails, decoded together with others: the others are decoded again
    without it and answered, and it alone gets the error."""
    from attn_cli.errors import UserError

    server = server_of(served_checkpoint)
    expected = [t.text for t in reference(server, SENTENCES[:3])]
    engine = next(iter(server.models)).engine
    bad = tuple(engine.tokenizers.prefixed(engine.tokenizers.source.encode([SENTENCES[1]]))[0])
    searcher = engine.searcher

    def failing_searcher(options, stop=None):
        search = searcher(options, stop)

        def failing(parts, terms=None):
            if any(part.ids == bad for part in parts):
                raise UserError("this sentence cannot be decoded")
            return search(parts, terms)

        return failing

    monkeypatch.setattr(engine, "searcher", failing_searcher)
    answers = asyncio.run(_send_while_stopped(server, [{"q": s} for s in SENTENCES[:3]], "/v1/translate"))
    assert [answer.status_code for answer in answers] == [200, 400, 200]
    assert "cannot be decoded" in answers[1].json()["error"]
    assert [answers[i].json()["translations"][0]["translation"] for i in (0, 2)] == [expected[0], expected[2]]
    assert server.batchers["en-zh"].stats.calls == 2, "the call of all three failed; then each alone, two decoded"


def test_a_full_queue_answers_429_and_accepted_requests_are_still_answered(served_checkpoint):
    server = server_of(served_checkpoint, queue_sentences=3)

    async def scenario():
        async with _client(create_app(server)) as client:
            first = asyncio.ensure_future(client.post("/v1/translate", json={"q": "\n".join(SENTENCES[:3])}))
            while server.batchers["en-zh"].queued_sentences < 3:
                await asyncio.sleep(0.01)
            refused = await client.post("/translate", json={"q": SENTENCES[3], "source": "en", "target": "zh"})
            server.start()
            try:
                return refused, await first
            finally:
                server.stop()

    refused, first = asyncio.run(scenario())
    assert refused.status_code == 429 and "queue is full" in refused.json()["error"]
    assert first.status_code == 200 and len(first.json()["translations"][0]["sentences"]) == 3


def test_a_request_that_times_out_is_dropped(served_checkpoint):
    server = server_of(served_checkpoint, timeout=0.2)

    async def scenario():
        async with _client(create_app(server)) as client:
            late = await client.post("/translate", json={"q": SENTENCES[0], "source": "en", "target": "zh"})
            server.limits = dataclasses.replace(server.limits, timeout=60)  # the next one waits as long as it takes
            server.start()  # the worker finds the timed-out job cancelled and skips it
            try:
                on_time = await client.post("/translate", json={"q": SENTENCES[1], "source": "en", "target": "zh"})
            finally:
                server.stop()
            return late, on_time

    late, on_time = asyncio.run(scenario())
    assert late.status_code == 503 and "did not begin" in late.json()["error"]
    assert on_time.status_code == 200
    stats = server.batchers["en-zh"].stats
    assert (stats.cancelled, stats.sentences) == (1, 1)


async def _leaving_call(app, body: dict, path: str, gone: asyncio.Event) -> list[dict]:
    """The raw ASGI call of a client that sends its request, then disconnects once `gone` is set."""
    raw = json.dumps(body).encode()
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return sent


def test_a_client_that_goes_away_is_dropped_and_holds_up_nobody(served_checkpoint):
    server = server_of(served_checkpoint)
    app = create_app(server)

    async def scenario():
        gone = asyncio.Event()
        body = {"q": SENTENCES[0], "source": "en", "target": "zh"}
        leaving = asyncio.ensure_future(_leaving_call(app, body, "/translate", gone))
        async with _client(app) as client:
            staying = asyncio.ensure_future(
                client.post("/translate", json={"q": SENTENCES[1], "source": "en", "target": "zh"})
            )
            while server.batchers["en-zh"].stats.requests < 2:
                await asyncio.sleep(0.01)
            gone.set()
            departed = await leaving
            server.start()
            try:
                return departed, await staying
            finally:
                server.stop()

    departed, staying = asyncio.run(scenario())
    assert departed[0]["status"] == 499
    assert staying.status_code == 200
    assert staying.json()["translatedText"] == reference(server, [SENTENCES[1]])[0].text
    stats = server.batchers["en-zh"].stats
    assert stats.cancelled == 1 and stats.sentences == 1, "the departed client's sentence was never decoded"


@pytest.mark.slow  # waits out a grace period
def test_stopping_with_a_grace_ends_even_while_a_decode_is_stuck(served_checkpoint, monkeypatch):
    """SIGTERM's last step: a worker stuck in a decode cannot keep the process from exiting."""
    import threading
    import time

    from attn_cli.serving import batcher as batcher_module

    server = server_of(served_checkpoint)
    release, started = threading.Event(), threading.Event()

    def stuck(engine, parts, options, **given):
        started.set()
        release.wait(30)  # a decode that will not end within the grace
        return []

    monkeypatch.setattr(batcher_module, "decode_parts_with_terms", stuck)

    async def scenario():
        server.start()
        work = asyncio.ensure_future(server.translate(_request()))
        while not started.is_set():
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await asyncio.to_thread(server.stop, 0.5)
        waited = time.monotonic() - began
        work.cancel()
        return waited

    try:
        waited = asyncio.run(scenario())
    finally:
        release.set()
    assert waited < 5, f"stop waited {waited:.1f} s for a stuck worker"
    assert server.batchers["en-zh"]._thread.is_alive(), "the worker was still stuck: the grace ended the wait"


def _request():
    from attn_cli.serving.request import TranslationRequest

    return TranslationRequest([SENTENCES[0]], source="en", target="zh")


def test_health_says_not_ready_while_a_worker_is_stuck_or_its_queue_is_nearly_full(served_checkpoint, monkeypatch):
    import threading

    from attn_cli.decoding.pipeline import Decoded
    from attn_cli.serving import batcher as batcher_module

    release, started = threading.Event(), threading.Event()

    def stuck(engine, parts, options, **given):
        started.set()
        release.wait(30)
        return Decoded([], [[] for _ in parts])

    monkeypatch.setattr(batcher_module, "decode_parts_with_terms", stuck)
    server = server_of(served_checkpoint, timeout=0.3, queue_sentences=10)
    body = {"q": SENTENCES[0], "source": "en", "target": "zh"}

    async def scenario():
        async with _client(create_app(server)) as client:
            ready = await client.get("/health")
            # nine sentences wait while the worker is stopped: nine-tenths of the queue
            waiting = [asyncio.ensure_future(client.post("/translate", json=body)) for _ in range(9)]
            while server.batchers["en-zh"].queued_sentences < 9:
                await asyncio.sleep(0.01)
            full = await client.get("/health")
            server.start()
            while not started.is_set():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.4)  # past the timeout in one decoding call
            stuck_answer = await client.get("/health")
            release.set()
            await asyncio.gather(*waiting, return_exceptions=True)
            server.stop(5)
            return ready, full, stuck_answer

    try:
        ready, full, stuck_answer = asyncio.run(scenario())
    finally:
        release.set()
    assert ready.status_code == 200 and ready.json()["status"] == "ok"
    assert full.status_code == 503 and "queue is full (9 of 10" in full.json()["reason"]
    assert stuck_answer.status_code == 503 and "in one decoding call" in stuck_answer.json()["reason"]


def test_a_decode_whose_clients_all_went_away_stops_between_steps(served_checkpoint):
    """A model made never to end, asked for 512 tokens at beam 16 without learned lengths, would
    search for several seconds. Once its only client goes away, it stops at the next step, and a
    short request sent after it is answered."""
    import time

    from attn_cli.vocab import EOS_ID

    server = server_of(served_checkpoint)
    app = create_app(server)
    model = server.models.named("en-zh").engine.models[0]
    decode = model.decode

    def never_ending(*args, **kwargs):
        time.sleep(0.01)  # some 5 s for 512 steps
        logits = decode(*args, **kwargs)
        logits[..., EOS_ID] = float("-inf")
        return logits

    model.decode = never_ending
    long_body = {"q": SENTENCES[0], "beam_size": 16, "max_len_b": 512, "learned_lengths": False, "no_loops": False}

    async def scenario():
        gone = asyncio.Event()
        server.start()
        try:
            leaving = asyncio.ensure_future(_leaving_call(app, long_body, "/v1/translate", gone))
            while server.batchers["en-zh"].decoding_since is None:
                await asyncio.sleep(0.01)
            gone.set()
            departed = await leaving
            began = time.monotonic()
            model.decode = decode
            async with _client(app) as client:
                short = await client.post("/v1/translate", json={"q": SENTENCES[1], "beam_size": 1})
            return departed, short, time.monotonic() - began
        finally:
            server.stop(10)

    departed, short, waited = asyncio.run(scenario())
    assert departed[0]["status"] == 499
    assert short.status_code == 200
    assert server.batchers["en-zh"].stats.stopped == 1
    assert waited < 5, f"the short request waited {waited:.1f} s behind a decode nobody wanted"


@pytest.mark.slow  # a long request decoded in turns past a timeout
def test_a_request_whose_decoding_has_begun_is_not_dropped_at_the_timeout(served_checkpoint):
    """The timeout bounds the wait for a request's first turn: a long request decoded in turns for
    longer than it is answered in full, as it is decoded whole."""
    import time

    server = server_of(served_checkpoint, timeout=0.2, turn_work=60)
    model = server.models.named("en-zh").engine.models[0]
    decode = model.decode

    def slow(*args, **kwargs):
        time.sleep(0.005)
        return decode(*args, **kwargs)

    model.decode = slow
    lines = (SENTENCES * 4)[:10]

    async def scenario():
        server.start()
        try:
            began = time.monotonic()
            async with _client(create_app(server)) as client:
                answer = await client.post("/v1/translate", json={"q": lines, "beam_size": 4})
            return answer, time.monotonic() - began
        finally:
            server.stop()

    answer, took = asyncio.run(scenario())
    model.decode = decode
    assert answer.status_code == 200, answer.text
    assert took > 0.2, "it outlasted the timeout"
    whole = [t.text for t in reference(server, lines, beam_size=4)]
    assert [text["sentences"][0]["translation"] for text in answer.json()["translations"]] == whole


def test_the_queue_counts_work_so_a_wide_beam_is_refused_at_once_when_full(served_checkpoint):
    """Work is source tokens times beam: a second beam-16 request does not fit beside the first,
    and is answered 429 at once, while a greedy one of the same sentence still does."""
    server = server_of(served_checkpoint)
    tokenizers = server.models.named("en-zh").engine.tokenizers
    tokens = len(tokenizers.prefixed(tokenizers.source.encode([SENTENCES[0]]))[0]) + 1  # and its EOS
    batcher = server.batchers["en-zh"]
    batcher.work_capacity = 16 * tokens + tokens  # one wide request and one greedy, not two wide
    wide = {"q": SENTENCES[0], "beam_size": 16, "n_best": 1}
    greedy = {"q": SENTENCES[0], "beam_size": 1}
    answers = asyncio.run(_send_while_stopped(server, [wide, wide, greedy], path="/v1/translate", queued=2))
    assert [answer.status_code for answer in answers] == [200, 429, 200]
    assert "units of work waiting" in answers[1].json()["error"]
    assert batcher.queued_work == 0, "every answered job's work left the queue"


@pytest.mark.slow  # clients in threads, decoded in turns
def test_a_long_request_goes_in_turns_and_a_short_one_is_answered_between_them(served_checkpoint):
    """Queued behind a long request, a short one waits for one turn of it, not for all of it; the
    long request's translations, decoded in slices, are the ones it gets decoded whole."""
    server = server_of(served_checkpoint, turn_work=60)
    long_lines = (SENTENCES * 4)[:12]
    long_body = {"q": long_lines, "beam_size": 4}
    short_body = {"q": SENTENCES[1], "beam_size": 1}
    finished = []

    async def scenario():
        async with _client(create_app(server)) as client:

            async def send(name, body):
                answer = await client.post("/v1/translate", json=body)
                finished.append(name)
                return answer

            long_answer = asyncio.ensure_future(send("long", long_body))
            batcher = server.batchers["en-zh"]
            while batcher.stats.requests < 1:
                await asyncio.sleep(0.01)
            short_answer = asyncio.ensure_future(send("short", short_body))
            while batcher.stats.requests < 2:
                await asyncio.sleep(0.01)
            server.start()
            try:
                return await long_answer, await short_answer
            finally:
                server.stop()

    long_answer, short_answer = asyncio.run(scenario())
    assert long_answer.status_code == short_answer.status_code == 200
    assert finished == ["short", "long"], "the short request was answered between two turns of the long one"
    whole = [t.text for t in reference(server, long_lines, beam_size=4)]
    assert [text["sentences"][0]["translation"] for text in long_answer.json()["translations"]] == whole
    batcher = server.batchers["en-zh"]
    assert batcher.stats.sliced == 1 and batcher.stats.calls > 3
    assert batcher.queued_work == batcher.queued_sentences == 0, "every slice's work left the queue"


def test_shutdown_past_its_grace_stops_a_search_in_progress_and_ends_the_worker(served_checkpoint):
    """A decode still running when the grace is over is cancelled and stops at its next step, so
    the worker thread ends and the process can exit cleanly (a thread left inside torch aborts it)."""
    import time

    from attn_cli.vocab import EOS_ID

    server = server_of(served_checkpoint)
    model = server.models.named("en-zh").engine.models[0]
    decode = model.decode

    def never_ending(*args, **kwargs):
        time.sleep(0.01)
        logits = decode(*args, **kwargs)
        logits[..., EOS_ID] = float("-inf")
        return logits

    model.decode = never_ending
    from attn_cli.serving.request import TranslationRequest

    request = TranslationRequest(
        [SENTENCES[0]],
        source="en",
        target="zh",
        options={"beam_size": 16, "max_len_b": 512, "learned_lengths": False, "no_loops": False},
    )

    async def scenario():
        server.start()
        work = asyncio.ensure_future(server.translate(request))
        while server.batchers["en-zh"].decoding_since is None:
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await asyncio.to_thread(server.stop, 0.3)
        waited = time.monotonic() - began
        with pytest.raises(asyncio.CancelledError):
            await work
        return waited

    waited = asyncio.run(scenario())
    assert not server.batchers["en-zh"]._thread.is_alive(), "the worker ended"
    assert server.batchers["en-zh"].stats.stopped == 1
    assert waited < 2.5, f"stop took {waited:.1f} s"


def test_a_job_without_parts_is_answered_and_leaves_the_queue_empty(served_checkpoint):
    """Sentences with nothing to decode (an empty source has no parts) are answered with empty
    translations, alone or beside a real one, and leave the queue's counts."""
    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.records import Source

    server = server_of(served_checkpoint)
    engine, batcher = server.models.named("en-zh").engine, server.batchers["en-zh"]
    options = engine.config.decode

    async def scenario():
        server.start()
        try:
            empty = split_sources(engine, [Source(""), Source("")], options)
            mixed = split_sources(engine, [Source(SENTENCES[0]), Source("")], options)
            assert not any(source.parts for source in empty)
            return await asyncio.wait_for(
                asyncio.gather(batcher.translate(empty, options), batcher.translate(mixed, options)), 60
            )
        finally:
            server.stop()

    empty, mixed = asyncio.run(scenario())
    assert [t.text for t in empty] == ["", ""]
    assert [t.text for t in mixed] == [reference(server, [SENTENCES[0]])[0].text, ""]
    assert batcher.queued_sentences == batcher.queued_work == 0


def test_a_job_without_parts_times_out_while_it_waits_like_any_other(served_checkpoint):
    import time

    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.records import Source

    server = server_of(served_checkpoint)  # its worker never started: nothing begins
    engine, batcher = server.models.named("en-zh").engine, server.batchers["en-zh"]
    empty = split_sources(engine, [Source("")], engine.config.decode)

    async def scenario():
        began = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.translate(empty, engine.config.decode, timeout=0.2), 5)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 2, "its own timeout ended the wait, not the test's"
    assert batcher.queued_sentences == 1, "dropped only when the worker comes to it"
