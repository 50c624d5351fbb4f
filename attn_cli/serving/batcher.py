"""One model worker per served model: it drains a queue of translation jobs and decodes the sentences
of concurrent requests together, so that throughput grows with load instead of serialising it.

A request's sentences are one `Job`, already encoded into the parts the model decodes (the server
does it as the request arrives, so nothing is tokenized twice). The worker takes the oldest job, and
while the queue holds fewer source tokens than the token budget it waits up to `max_wait` seconds
from that job's arrival for others; then it decodes the waiting jobs that share its decoding
options in one pass of the translation pipeline (attn_cli/decoding/pipeline.py, which sorts their
parts by length into token-budget batches).
It waits only while requests are concurrent, that is when its last call decoded more than one job:
a lone client's request is decoded at once, with nobody to wait for, and under load jobs are
already waiting.

Turns: one decoding call takes at most `turn_work` units of work (a part's source tokens times its
beam: what its decoding costs) and `token_budget` source tokens, in the parts the model decodes (a
sentence, or a clause of a long one), in order. A job with more goes in slices: after each, the
rest of it goes to the back of the queue, behind the requests that arrived meanwhile. A long
request so shares the worker with short ones, which wait for one turn of it, not for all of it. A
job's translations are assembled from its parts' outputs once the last is in.

The queue holds at most `capacity` sentences and `work_capacity` units of work: a request that
would pass either is refused at once (`QueueFull`, answered 429) rather than letting memory grow,
or waiting past its timeout behind work the worker cannot begin in time. A job whose client went
away or timed out is cancelled: the worker skips what it has not started, and stops a call all of
whose jobs are cancelled between two search steps. Stopping answers every job already accepted
before the thread ends.
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
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.pipeline import assemble, decode_parts_with_terms
from attn_cli.decoding.records import Part, SourceParts, Translation

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Engine


CANCELLED_GRACE = 2.0  # seconds a worker has to stop once its jobs are cancelled at shutdown


class QueueFull(Exception):
    """The queue has no room for a request's sentences."""


@dataclass
class Job:
    prepared: list[SourceParts]  # the request's sentences, encoded
    options: DecodeConfig
    weight: int  # work per source token: the beam (or the samples drawn)
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    taken: int = 0  # parts handed to decoding calls so far; the rest wait in the queue
    handed: bool = False  # its last part (or, with none, itself) handed to a call: nothing of it waits
    outputs: list[list[Hypothesis]] = field(default_factory=list)  # the decoded parts' hypotheses, in order

    def __post_init__(self):
        self.parts: list[Part] = [part for source in self.prepared for part in source.parts]
        self.part_tokens = [len(part.ids) + 1 for part in self.parts]  # and the EOS

    @property
    def tokens(self) -> int:
        """The source tokens still waiting."""
        return sum(self.part_tokens[self.taken :])

    @property
    def work(self) -> int:
        """The work still waiting: its source tokens times its weight."""
        return self.tokens * self.weight

    @property
    def waiting(self) -> int:
        """Its sentences, while any of its parts waits: what the queue's capacity counts."""
        return 0 if self.handed else len(self.prepared)

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
class Slice:
    """Parts `start` to `end` of a job: its share of one decoding call."""

    job: Job
    start: int
    end: int


@dataclass
class BatcherStats:
    requests: int = 0
    sentences: int = 0
    calls: int = 0  # decoding calls: requests / calls is how many requests one call served
    sliced: int = 0  # jobs decoded in more than one turn
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
        turn_work: int = 600,
    ):
        self.engine, self.capacity, self.max_wait, self.token_budget = engine, capacity, max_wait, token_budget
        self.work_capacity, self.turn_work = work_capacity, turn_work
        self.batching = batching  # False: one request per decoding call, the one-at-a-time baseline
        self.stats = BatcherStats()
        self._queue: deque[Job] = deque()
        # What waits: the sentences, source tokens and work of every job not yet handed to a call.
        self._queued_sentences = self._queued_tokens = self._queued_work = 0
        self._changed = threading.Condition()
        self._stopping = False
        self._last_group_size = 0  # jobs the last decoding call served: more than one means concurrent load
        self.decoding_since: float | None = None  # time.monotonic() when the running call began; None: idle
        self._turn: list[Slice] = []  # the running call's slices
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
        """Accept nothing more, answer every job already queued, end the worker. After `timeout`
        seconds every job left is cancelled, so that the worker stops at its next search step."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._changed:
                for job in [*self._queue, *(piece.job for piece in self._turn)]:
                    job.cancelled = True
            self._thread.join(CANCELLED_GRACE)

    async def translate(
        self, prepared: Sequence[SourceParts], options: DecodeConfig, timeout=None
    ) -> list[Translation]:
        """The translations of a request's encoded sentences, decoded with whatever else is waiting.
        Raises QueueFull when there is no room, TimeoutError when its decoding has not begun after
        `timeout` seconds (it is dropped); once begun, it goes on in turns to its end. A cancelled
        caller (its client went away) drops its job, between two search steps if need be."""
        loop = asyncio.get_running_loop()
        weight = (1 if options.sample else options.beam_size) * (options.n_best if options.sample else 1)
        job = Job(list(prepared), options, weight, loop.create_future(), loop)
        self._put(job)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(job.future), timeout)
            except asyncio.TimeoutError:
                if not (job.taken or job.handed):  # still waiting for its first turn
                    raise
            return await asyncio.shield(job.future)
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
            self._queued_sentences += job.waiting
            self._queued_tokens += job.tokens
            self._queued_work += job.work
            self.stats.requests += 1
            self._changed.notify_all()

    def _take(self, job: Job, end: int) -> None:
        """Hand `job`'s parts up to `end` to a call (or, with `end` its last, drop the rest): they no
        longer count as waiting. The caller holds the lock."""
        sentences, tokens, work = job.waiting, job.tokens, job.work
        job.taken, job.handed = end, end >= len(job.parts)
        self._queued_sentences -= sentences - job.waiting
        self._queued_tokens -= tokens - job.tokens
        self._queued_work -= work - job.work

    def _forget(self, job: Job) -> None:
        with self._changed:
            self._take(job, len(job.parts))

    def _run(self) -> None:
        while True:
            turn = self._next_turn()
            if turn is None:
                return
            if turn:
                self._decode(turn)

    def _next_turn(self) -> list[Slice] | None:
        """The slices of the next decoding call ([] when all waiting were cancelled), None once
        stopped with nothing left. The oldest job comes first, and later ones join it while they
        share its options and the turn has room; a job that does not fit whole gives a slice."""
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
            turn: list[Slice] = []
            tokens = work = 0
            kept: deque[Job] = deque()
            while self._queue:
                job = self._queue.popleft()
                if job.cancelled:
                    self.stats.cancelled += 1
                    self._take(job, len(job.parts))
                    continue
                if turn and not (self.batching and job.joins(turn[0].job)):
                    kept.append(job)
                    continue
                end = job.taken
                while end < len(job.parts):
                    more = job.part_tokens[end]
                    if (turn or end > job.taken) and (
                        tokens + more > self.token_budget or work + more * job.weight > self.turn_work
                    ):
                        break
                    tokens, work, end = tokens + more, work + more * job.weight, end + 1
                if end == job.taken and job.parts:  # the turn is full
                    kept.append(job)
                    continue
                turn.append(Slice(job, job.taken, end))
                self._take(job, end)
            self._queue = kept
            self._last_group_size = len(turn)
            return turn

    def _decode(self, turn: list[Slice]) -> None:
        self.decoding_since, self._turn = time.monotonic(), turn
        try:
            self._decode_turn(turn)
        finally:
            self.decoding_since, self._turn = None, []
        with self._changed:
            for piece in turn:
                job = piece.job
                if job.taken < len(job.parts) and piece.end == job.taken:
                    if piece.start == 0:
                        self.stats.sliced += 1
                    self._queue.append(job)  # the rest of it, behind whoever came meanwhile
            self._changed.notify_all()

    def _decode_turn(self, turn: list[Slice]) -> None:
        """Decode the turn in one call; if that fails, each slice alone, so that a request whose
        decoding fails fails by itself (what a request can get wrong is refused before it is queued).
        A call all of whose jobs are cancelled (timed out, or their clients gone) stops between two
        search steps, and its memory goes with it."""
        if len(turn) > 1:
            try:
                outputs = self._search(turn)
            except SearchStopped:
                self._stopped(turn)
                return
            except Exception:
                outputs = None
            if outputs is not None:
                for piece, found in zip(turn, outputs):
                    self._decoded(piece, found)
                return
        for piece in turn:
            try:
                self._decoded(piece, self._search([piece])[0])
            except SearchStopped:
                self._stopped([piece])
            except Exception as error:
                self._forget(piece.job)
                piece.job.answer(error=error)

    def _decoded(self, piece: Slice, found: list[list[Hypothesis]]) -> None:
        """A slice's outputs: the job's translations are assembled and sent once its last part is in."""
        job = piece.job
        job.outputs.extend(found)
        if len(job.outputs) == len(job.parts):
            job.answer(assemble(self.engine, job.prepared, job.outputs, job.options))

    def _stopped(self, turn: list[Slice]) -> None:
        self.stats.stopped += 1
        for piece in turn:
            self._forget(piece.job)
            piece.job.answer(dropped=True)

    def _search(self, turn: list[Slice]) -> list[list[list[Hypothesis]]]:
        """Each slice's parts decoded (stages 2 and 3 of the pipeline), in one call."""
        parts = [part for piece in turn for part in piece.job.parts[piece.start : piece.end]]
        jobs = [piece.job for piece in turn]
        outputs = decode_parts_with_terms(
            self.engine, parts, jobs[0].options, stop=lambda: all(job.cancelled for job in jobs)
        ).outputs
        self.stats.calls += 1
        self.stats.sentences += sum(len(piece.job.prepared) for piece in turn if piece.end == len(piece.job.parts))
        found, start = [], 0
        for piece in turn:
            found.append(outputs[start : start + piece.end - piece.start])
            start += piece.end - piece.start
        return found
