"""ringlimit.v1's ``CheckStream``: one long-lived stream of checks per owner channel, which
spares the node a call's setup (HTTP/2 stream, headers, trailers) per check or batch. Each
request carries an id; its response the same id, so answers may come in any order.

:class:`CheckStream` is the synchronous client's (grpcio writes the requests from a queue on
its own thread; a thread of ours reads the answers and hands each to its request's callback),
:class:`AioCheckStream` the asyncio client's (a reader task). A stream that breaks fails every
request in flight on it with its error, as a failed call fails its checks; the next request
opens a new one. A node that does not offer the stream (an older node: UNIMPLEMENTED) or
refuses it (no client credential where one is needed) is sent unary calls instead."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from typing import Any, Callable, Dict, List, Optional

import grpc

from .v1 import ratelimiter_pb2 as pb

#: The stream's own refusals: its requests were never decided, and unary calls are answered.
REFUSED = frozenset(
    (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
)


class StreamEnded(Exception):
    """The node ended the stream without an error (it is going away)."""


class NotSent(Exception):
    """A request that never left the client: the stream's write failed (the node had ended the
    call already). Its checks were not decided, so another call may decide them."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"check stream write failed: {cause!r}")
        self.cause = cause


def refused(e: BaseException) -> bool:
    """Whether ``e`` is a node's refusal of the stream itself (send unary calls instead)."""
    code = getattr(e, "code", None)
    return isinstance(e, grpc.RpcError) and code is not None and code() in REFUSED


#: A request's callback: the response, or the error that broke the stream.
Callback = Callable[[Optional[Any], Optional[BaseException]], None]

_END = None


class CheckStream:
    """One CheckStream call on ``stub``'s channel (synchronous grpcio)."""

    def __init__(self, stub: Any, metadata: Any, name: str) -> None:
        self._q: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[int, Callback] = {}
        self.broken = False
        self._call = stub.CheckStream(iter(self._q.get, _END), metadata=metadata)
        threading.Thread(target=self._read, name=name, daemon=True).start()

    def send(self, checks: List[Any], callback: Callback) -> bool:
        """Sends one request of ``checks``; ``callback`` gets its response or the stream's
        error, once. False when the stream is broken already (``callback`` is not called)."""
        with self._lock:
            if self.broken:
                return False
            rid = next(self._ids)
            self._pending[rid] = callback
        self._q.put(pb.CheckStreamRequest(id=rid, checks=checks))
        return True

    def abort(self) -> None:
        """Breaks the stream (its requests in flight fail with CANCELLED)."""
        self._call.cancel()

    def close(self) -> None:
        self._q.put(_END)
        self._call.cancel()

    def _read(self) -> None:
        error: BaseException = StreamEnded("the node ended the check stream")
        try:
            for resp in self._call:
                with self._lock:
                    cb = self._pending.pop(resp.id, None)
                if cb is not None:
                    cb(resp, None)
        except Exception as e:  # grpc.RpcError: the stream broke; every request fails with it
            error = e
        with self._lock:
            self.broken = True
            pending, self._pending = self._pending, {}
        self._q.put(_END)
        for cb in pending.values():
            cb(None, error)


class AioCheckStream:
    """One CheckStream call on ``stub``'s ``grpc.aio`` channel; made on the running loop."""

    def __init__(self, stub: Any, metadata: Any) -> None:
        self._call = stub.CheckStream(metadata=metadata)
        self._ids = itertools.count(1)
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        self.broken: Optional[BaseException] = None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def ask(self, checks: List[Any], within_s: float) -> Any:
        """The response to one request of ``checks``; raises the stream's error, or
        ``asyncio.TimeoutError`` (the stream is then aborted: a request unanswered within the
        deadline means a stream that cannot be trusted)."""
        if self.broken is not None:
            raise self.broken
        rid = next(self._ids)
        fut: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            try:
                await self._call.write(pb.CheckStreamRequest(id=rid, checks=checks))
            except grpc.RpcError as e:
                # A write racing the node's end of the call (a refusal: UNIMPLEMENTED...) fails
                # as INTERNAL, which hides the call's status; the reader ends with the status
                # (grpcio sometimes records the write's INTERNAL instead: then NotSent).
                try:
                    await asyncio.wait_for(asyncio.shield(self._reader), within_s)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    pass
                if self.broken is not None and refused(self.broken):
                    raise self.broken from None
                raise NotSent(e) from e
            return await asyncio.wait_for(fut, within_s)
        except asyncio.TimeoutError:
            self.abort()
            raise
        finally:
            self._pending.pop(rid, None)
            # The stream's error may have been set here too when the write raised it first.
            if fut.done() and not fut.cancelled():
                fut.exception()

    def abort(self) -> None:
        self._call.cancel()

    async def _read(self) -> None:
        error: BaseException = StreamEnded("the node ended the check stream")
        try:
            while True:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    break
                fut = self._pending.pop(resp.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except asyncio.CancelledError:
            error = StreamEnded("the check stream was closed")
        except Exception as e:  # grpc.aio.AioRpcError: the stream broke
            error = e
        self.broken = error
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)
