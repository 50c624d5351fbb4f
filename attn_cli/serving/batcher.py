"""One model worker per served model: it drains a queue of translation jobs and decodes the sentences
of concurrent requests together, so that throughput grows with load instead of serialising it.

A request's sentences are one `Job`, already encoded into the parts the model decodes (the server
does it as the request arrives, so nothing is tokenized twice). The worker takes the oldest job, and
while the queue holds fewer source tokens than the token budget it waits up to `max_wait` seconds
from that job's arrival for others; then it decodes every waiting job with the same decoding
options, up to the budget, in one pass of the translation pipeline (attn_cli/decoding/pipeline.py,
which sorts their parts by length into token-budget batches).
It waits only while requests are concurrent, that is when its last call decoded more than one job:
a lone client's request is decoded at once, with nobody to wait for, and under load jobs are
already waiting.

The queue holds at most `capacity` sentences and `work_capacity` units of work (a job's source
tokens times its beam, what its decoding costs): a request that would pass either is refused at
once (`QueueFull`, answered 429) rather than letting memory grow, or waiting past its timeout
behind work the worker cannot finish in time. A job whose client went away or timed out is
cancelled, and the worker skips it if it has not started it. Stopping answers every job already
accepted before the thread ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attn_cli.config import DecodeConfig
from attn_cli.decoding.engine import SearchStopped
from attn_cli.decoding.pipeline import translate_prepared
from attn_cli.decoding.records import SourceParts, Translation

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Engine


class QueueFull(Exception):
    """The queue has no room for a request's sentences."""


@dataclass
class Job:
    prepared: list[SourceParts]  # the request's sentences, encoded
    options: DecodeConfig
    tokens: int  # its source tokens: what the token budget counts
    work: int  # its source tokens times its beam: what the queue's work capacity counts
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False

    def joins(self, other: Job) -> bool:
        """Whether the two decode in one call: the same options, and no seed (a seeded sample is
        repeatable only when decoded alone, as `attn translate` would)."""
        return self.options == other.options and self.options.seed is None

    def answer(
        self, result: list[Translation] | None = None, error: BaseException | None = None, dropped: bool = False
    ) -> None:
        """Resolve the request's future from the worker thread (a no-op if it gave up waiting);
        `dropped`: cancel it, for a job whose decoding was stopped (no error for nobody to read)."""

        def resolve():
            if self.future.done():
                return
            if dropped:
                self.future.cancel()
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the event loop is closed: nobody waits for the answer
            pass


@dataclass
class BatcherStats:
    requests: int = 0
    sentences: int = 0
    calls: int = 0  # decoding calls: requests / calls is how many requests one call served
    refused: int = 0  # 429s
    cancelled: int = 0  # jobs dropped before their decoding began
    stopped: int = 0  # decoding calls stopped between steps: every job in them was cancelled


class Batcher:
    def __init__(
        self,
        engine: Engine,
        capacity: int = 1024,
        max_wait: float = 0.005,
        token_budget: int = 4000,
        batching=True,
        work_capacity: int = 120_000,
    ):
        self.engine, self.capacity, self.max_wait, self.token_budget = engine, capacity, max_wait, token_budget
        self.work_capacity = work_capacity
        self._queued_work = 0
        self.batching = batching  # False: one request per decoding call, the one-at-a-time baseline
        self.stats = BatcherStats()
        self._queue: deque[Job] = deque()
        self._queued_sentences = 0
        self._queued_tokens = 0
        self._changed = threading.Condition()
        self._stopping = False
        self._last_group_size = 0  # jobs the last decoding call served: more than one means concurrent load
        self.decoding_since: float | None = None  # time.monotonic() when the running call began; None: idle
        language = engine.config.data
        self._thread = threading.Thread(
            target=self._run, name=f"model-worker-{language.src_lang}-{language.tgt_lang}", daemon=True
        )

    @property
    def queued_sentences(self) -> int:
        return self._queued_sentences

    @property
    def queued_work(self) -> int:
        return self._queued_work

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Accept nothing more, answer every job already queued, end the worker."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout)

    async def translate(
        self, prepared: Sequence[SourceParts], options: DecodeConfig, timeout=None
    ) -> list[Translation]:
        """The translations of a request's encoded sentences, decoded with whatever else is waiting.
        Raises QueueFull when there is no room, TimeoutError after `timeout` seconds (the job is
        dropped if it has not started); a cancelled caller (its client went away) drops its job too."""
        loop = asyncio.get_running_loop()
        tokens = sum(len(part.ids) + 1 for source in prepared for part in source.parts)
        work = tokens * (1 if options.sample else options.beam_size) * (options.n_best if options.sample else 1)
        job = Job(list(prepared), options, tokens, work, loop.create_future(), loop)
        self._put(job)
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            job.cancelled = True
            raise

    def _put(self, job: Job) -> None:
        with self._changed:
            if self._stopping or self._queued_sentences + len(job.prepared) > self.capacity:
                self.stats.refused += 1
                raise QueueFull(
                    f"the queue is full ({self._queued_sentences} sentences waiting, room for {self.capacity})"
                )
            if self._queued_work and self._queued_work + job.work > self.work_capacity:
                # An empty queue takes any one job: its limits were checked on arrival.
                self.stats.refused += 1
                raise QueueFull(
                    f"the queue is full ({self._queued_work:,} units of work waiting, source tokens times beam; "
                    f"room for {self.work_capacity:,})"
                )
            self._queue.append(job)
            self._queued_work += job.work
            self._queued_sentences += len(job.prepared)
            self._queued_tokens += job.tokens
            self.stats.requests += 1
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            group = self._next_group()
            if group is None:
                return
            if group:
                self._decode(group)

    def _next_group(self) -> list[Job] | None:
        """The jobs of the next decoding call ([] when all waiting were cancelled), None once stopped
        with nothing left."""
        with self._changed:
            while not self._queue:
                if self._stopping:
                    return None
                self._changed.wait()
            if self.batching and self._last_group_size > 1:
                deadline = self._queue[0].arrived + self.max_wait
                while self._queued_tokens < self.token_budget and not self._stopping:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
            group, tokens, kept = [], 0, deque()
            while self._queue:
                job = self._queue.popleft()
                fits = not group or (self.batching and job.joins(group[0]) and tokens + job.tokens <= self.token_budget)
                if job.cancelled or fits:
                    self._queued_sentences -= len(job.prepared)
                    self._queued_tokens -= job.tokens
                    self._queued_work -= job.work
                    if job.cancelled:
                        self.stats.cancelled += 1
                        continue
                    group.append(job)
                    tokens += job.tokens
                else:
                    kept.append(job)
            self._queue = kept
            self._last_group_size = len(group)
            return group

    def _decode(self, group: list[Job]) -> None:
        self.decoding_since = time.monotonic()
        try:
            self._decode_group(group)
        finally:
            self.decoding_since = None

    def _decode_group(self, group: list[Job]) -> None:
        """Decode the group in one call; if that fails, each job alone, so that a request whose
        decoding fails fails by itself (what a request can get wrong is refused before it is queued).
        A call all of whose jobs are cancelled (timed out, or their clients gone) stops between two
        search steps, and its memory goes with it."""
        if len(group) > 1:
            try:
                results = self._translate_jobs(group)
            except SearchStopped:
                self._stopped(group)
                return
            except Exception:
                results = None
            if results is not None:
                for job, result in zip(group, results):
                    job.answer(result)
                return
        for job in group:
            try:
                job.answer(self._translate_jobs([job])[0])
            except SearchStopped:
                self._stopped([job])
            except Exception as error:
                job.answer(error=error)

    def _stopped(self, jobs: list[Job]) -> None:
        self.stats.stopped += 1
        for job in jobs:
            job.answer(dropped=True)

    def _translate_jobs(self, jobs: list[Job]) -> list[list[Translation]]:
        prepared = [source for job in jobs for source in job.prepared]
        translations = translate_prepared(
            self.engine, prepared, jobs[0].options, stop=lambda: all(job.cancelled for job in jobs)
        )
        self.stats.calls += 1
        self.stats.sentences += len(prepared)
        results, start = [], 0
        for job in jobs:
            results.append(translations[start : start + len(job.prepared)])
            start += len(job.prepared)
        return results
