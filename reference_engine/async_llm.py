"""The online front end: requests arrive at any time; ``generate`` is an async generator.

A background thread owns the engine core (the same ``LLMEngine``, hence the same ``Scheduler``,
as the offline ``LLM``). The event loop talks to it through a command queue; outputs come back
to each request's own ``asyncio.Queue``, a step's outputs in one ``call_soon_threadsafe`` per
event loop (one wake-up of the loop per step, not one per request). The engine thread is the
only one that touches the scheduler, so the scheduler needs no locks; readers of the KV-cache
state get the snapshot the thread publishes after every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import uuid
from collections.abc import AsyncGenerator, Iterable
from concurrent.futures import Future
from typing import Any

import torch

from reference_engine.config import AsyncEngineArgs, EngineConfig
from reference_engine.exceptions import EngineDeadError
from reference_engine.llm_engine import LLMEngine, PromptType
from reference_engine.outputs import RequestOutput
from reference_engine.request import Request
from reference_engine.sampling_params import SamplingParams
from reference_engine.stats import EngineStats, KVCacheStats


class AsyncLLM:
    def __init__(self, config: EngineConfig):
        self.dead_error: BaseException | None = None
        # request id -> (the consumer's loop, its queue, the request it waits for)
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, Request]] = {}
        # Engine thread only: the request each id names in the engine now. An id can be used
        # again as soon as its stream is closed, while the engine still runs the old request
        # until its abort is applied: outputs go to a stream only if they are its request's.
        self._live: dict[str, Request] = {}
        self._commands: queue.SimpleQueue[tuple[str, Any, Future | None]] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _streams between the loop and the engine thread
        self._stopping = False
        # The engine is built in its own thread: torch's OpenMP pool then belongs to the thread
        # that runs every step (sharing a pool with another thread ran steps ~1.5x slower on CPU).
        built: Future = Future()
        self._thread = threading.Thread(
            target=self._run, args=(config, built), name="engine-core", daemon=True
        )
        self._thread.start()
        self.engine: LLMEngine = built.result()
        self.model_config = config.model
        self.tokenizer = self.engine.tokenizer

    @classmethod
    def from_engine_args(cls, args: AsyncEngineArgs, **_: Any) -> AsyncLLM:
        return cls(args.create_config())

    # --- public API ----------------------------------------------------------------------------

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yields one ``RequestOutput`` per engine step that produced something for this request;
        the last has ``finished=True``. Closing the generator or cancelling its consumer aborts."""
        self._check_alive()
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        req = self.engine.process_request(request_id, prompt, sampling_params)
        stream: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"Request id {request_id!r} is already active.")
            self._streams[request_id] = (asyncio.get_running_loop(), stream, req)
        self._commands.put(("add", req, None))
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished and self.dead_error is None:
                self._commands.put(("abort", [request_id], None))  # closed or cancelled early

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Ends the requests at the next step and frees their KV blocks; their streams end with
        ``finish_reason="abort"``. Returns once the engine has applied it. Unknown ids: no-op."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self.dead_error is not None or not self._thread.is_alive():
            return
        done: Future = Future()
        self._commands.put(("abort", ids, done))
        await asyncio.wrap_future(done)

    def get_kv_cache_stats(self) -> KVCacheStats:
        return self._snapshot[0]

    def get_stats(self) -> EngineStats:
        return self._snapshot[1]

    def get_num_unfinished_requests(self) -> int:
        return self._snapshot[2]

    async def get_tokenizer(self):
        return self.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    def shutdown(self) -> None:
        """Stops the engine thread; streams still open end with ``EngineDeadError``. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        self._commands.put(("stop", None, None))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        if self.dead_error is None:
            self.dead_error = EngineDeadError("The engine was shut down.")
        self._fail_streams(self.dead_error)

    async def __aenter__(self) -> AsyncLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if not getattr(self, "_stopping", True):
            self._stopping = True
            self._commands.put(("stop", None, None))

    # --- the engine thread ---------------------------------------------------------------------

    def _run(self, config: EngineConfig, built: Future) -> None:
        torch.set_num_threads(torch.get_num_threads())
        try:
            engine = LLMEngine(config)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor's caller
            built.set_exception(e)
            return
        self.engine = engine
        self._publish()
        built.set_result(engine)
        try:
            while True:
                block = not engine.has_unfinished_requests()
                if not self._apply_commands(block):
                    return
                outputs = engine.step()
                self._publish()
                self._dispatch(outputs)
        except BaseException as e:  # noqa: BLE001 - any failure kills the engine
            err = EngineDeadError(f"The engine loop died: {type(e).__name__}: {e}")
            err.__cause__ = e
            self.dead_error = err
            self._fail_streams(err)
            self._drain_waiters()

    def _apply_commands(self, block: bool) -> bool:
        while True:
            try:
                kind, arg, done = self._commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if kind == "stop":
                self._drain_waiters()
                return False
            if kind == "add":
                self._add(arg)
            elif kind == "abort":
                self._dispatch(self.engine.abort_request(arg))
            self._publish()
            if done is not None:
                done.set_result(None)

    def _add(self, req: Request) -> None:
        with self._lock:
            entry = self._streams.get(req.request_id)
        # Its stream may be gone (closed before the engine saw it), or be a newer request's.
        if entry is not None and entry[2] is req:
            self._live[req.request_id] = req
            self.engine.add_request(req.request_id, req)

    def _publish(self) -> None:
        engine = self.engine
        self._snapshot = (
            engine.get_kv_cache_stats(),
            engine.get_stats(),
            engine.get_num_unfinished_requests(),
        )

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            targets = [self._streams.get(out.request_id) for out in outputs]
        per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for out, target in zip(outputs, targets):
            live = self._live.get(out.request_id)
            if out.finished and live is not None:
                del self._live[out.request_id]
            if target is not None and target[2] is live:
                loop, stream, _ = target
                per_loop.setdefault(loop, []).append((stream, out))
        for loop, items in per_loop.items():
            _put(loop, items)

    def _fail_streams(self, err: BaseException) -> None:
        with self._lock:
            targets = list(self._streams.values())
        for loop, stream, _ in targets:
            _put(loop, [(stream, err)])

    def _drain_waiters(self) -> None:
        while True:
            try:
                _, _, done = self._commands.get_nowait()
            except queue.Empty:
                return
            if done is not None and not done.done():
                done.set_result(None)

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if self._stopping:
            raise EngineDeadError("The engine was shut down.")


def _put(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, object]]) -> None:
    """Hands ``items`` to their queues on ``loop``, in order, in one callback."""
    # A closed consumer loop raises RuntimeError: nobody is listening any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in items:
        stream.put_nowait(item)
