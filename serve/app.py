"""The ASGI app: routes, auth, body limits, and the bridge from requests to the worker."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fastapi import FastAPI, Request
from moepack.runtime.engine import MP_ECTX, Engine, EngineError, OpenCancel
from moepack.runtime.tokenizer import Tokenizer, generation_eos_ids
from moepack.serve import sse
from moepack.serve.errors import ApiError, from_validation
from moepack.serve.job import Done, Job, Piece, ServerStopping
from moepack.serve.metrics import Metrics
from moepack.serve.offload import Offload
from moepack.serve.page_headers import page_headers
from moepack.serve.prepare import Preparer
from moepack.serve.responses import ChatOutput, ChatResponder, CompletionResponder
from moepack.serve.schemas import ChatRequest, CompletionRequest
from moepack.serve.vocab import Vocab
from moepack.serve.worker import Worker
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp

BaseModelT = TypeVar("BaseModelT", bound=BaseModel)
ReqT = TypeVar("ReqT")
T = TypeVar("T")

PAGE = Path(__file__).parent / "static" / "index.html"
_ENDPOINTS = {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions",
              "/v1/completions"}


@dataclass
class ServeConfig:
    path: str
    model_id: str
    api_key: str | None = None
    budget: str | None = None
    ctx: int | None = None
    kv: str | None = None  # KV cache entries: "f32", "f16" or None (the engine's default)
    threads: int | None = None
    kernels: str = "auto"  # the compute path (engine.KERNELS)
    max_queue: int = 16
    max_body: int = 4 << 20
    body_timeout: float = 60.0  # seconds for a whole body: 4 MiB at 70 KB/s
    open_cancel: OpenCancel | None = None  # stops the engine's trunk read (a signal at start)


class _CountRequests:
    """Pure ASGI (no BaseHTTPMiddleware: it would get between SSE and the disconnect)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_status(msg) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            self.metrics.requests[(path if path in _ENDPOINTS else "other", status)] += 1


class Server:
    """Engine, tokenizer, worker and the request handlers' shared state."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        # without a chat template /v1/completions still works; chat requests get a 400
        self.tok = Tokenizer.from_container(cfg.path)
        # PrefixReuse keeps one linear-attention state snapshot: counted in the floor
        self.engine = Engine(cfg.path, budget=cfg.budget, threads=cfg.threads, ctx=cfg.ctx,
                             kv=cfg.kv, snapshots=1, kernels=cfg.kernels,
                             cancel=cfg.open_cancel)
        self.vocab = Vocab(self.tok, self.engine.vocab_size, generation_eos_ids(cfg.path))
        self.prep = Preparer(self.tok, self.vocab, self.engine.ctx)
        # one thread: the engine runs one request at a time anyway, and a second big prompt
        # would double the tokenizer's peak memory
        self.offload = Offload(1, cfg.max_queue)
        self.metrics = Metrics()
        self.worker = Worker(self.engine, self.vocab, cfg.max_queue, self.metrics)
        self.started = int(time.time())
        self.page = PAGE.read_bytes()
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the app starts

    def stop_requests(self) -> None:
        """Answer every request that runs or waits with ServerStopping (a stream ends with an
        error event and `data: [DONE]`, a whole reply is a 503) so that the server can stop
        at once. Safe from a signal handler: the work runs in the event loop."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.worker.stop)

    def close(self) -> None:
        self.offload.close()
        if self.worker.close():  # a worker stuck inside the engine keeps it (process exits)
            self.engine.close()

    def check_key(self, request: Request) -> None:
        if self.cfg.api_key is None:
            return
        got = request.headers.get("authorization", "")
        scheme, _, key = got.partition(" ")
        # the scheme is case-insensitive (RFC 9110 11.1): "bearer KEY" is the same credential
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            key.lstrip(" ").encode(), self.cfg.api_key.encode())
        if not ok:
            raise ApiError(401, "Incorrect API key provided" if got else
                           "You didn't provide an API key (Authorization: Bearer KEY)",
                           code="invalid_api_key")

    async def parse(self, request: Request, model: type[BaseModelT]) -> BaseModelT:
        """The key checked, then the body (size-limited) validated as `model`."""
        self.check_key(request)
        try:
            return model.model_validate_json(await self.body(request))
        except ValidationError as e:
            raise from_validation(e) from None

    async def body(self, request: Request) -> bytes:
        """The body, at most max_body bytes, all in within body_timeout seconds (a client
        that drips it would hold its connection for ever)."""
        try:
            async with asyncio.timeout(self.cfg.body_timeout):
                return await _read_body(request, self.cfg.max_body)
        except TimeoutError:
            raise ApiError(408, f"the request body did not come within "
                           f"{self.cfg.body_timeout:g} s", code="request_timeout",
                           headers={"Connection": "close"}) from None

    async def prepare(self, fn: Callable[[ReqT], T], req: ReqT) -> T:
        """fn(req) (template, tokenizing) off the event loop; a full preparation queue's 429
        counts as a refusal like the engine queue's."""
        try:
            return await self.offload.run(fn, req)
        except ApiError as e:
            if e.status == 429:
                self.metrics.rejected += 1
            raise

    def submit(self, job: Job) -> None:
        job.events.loop = asyncio.get_running_loop()
        if self.worker.stopped is not None:
            raise _engine_error(self.worker.stopped)
        if not self.worker.submit(job):
            self.metrics.rejected += 1
            why = (f"the queue is full ({self.cfg.max_queue} waiting)" if self.cfg.max_queue
                   else "another request is running and this server keeps no queue "
                   "(--max-queue 0)")
            raise ApiError(429, f"{why}; retry later", code="rate_limit_exceeded",
                           headers={"Retry-After": str(self.worker.retry_after())})

    async def collect(self, job: Job, request: Request) -> tuple[list[Piece], Done]:
        """All of a job's events; a client that leaves cancels it at once."""
        gone = asyncio.ensure_future(_disconnect(request))
        pieces: list[Piece] = []
        try:
            while True:
                taker = asyncio.ensure_future(job.events.take())
                await asyncio.wait({taker, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not taker.done():
                    taker.cancel()
                    job.cancel.set()  # the engine stops within a layer's work
                    raise ClientDisconnect
                for ev in taker.result():
                    if isinstance(ev, BaseException):
                        raise _engine_error(ev)
                    if isinstance(ev, Done):
                        return pieces, ev
                    pieces.append(ev)
        finally:
            gone.cancel()

    async def stream(self, job: Job, responder, first: dict | None,
                     include_usage: bool) -> AsyncIterator[dict]:
        try:
            if first is not None:
                yield sse.data(first)
            end = None
            while end is None:
                evs = await job.events.take()
                # tokens that piled up while we were busy go out as one chunk
                pieces = [e for e in evs if isinstance(e, Piece)]
                chunk = responder.piece_chunk(pieces) if pieces else None
                if chunk is not None:
                    yield sse.data(chunk)
                end = next((e for e in evs if not isinstance(e, Piece)), None)
            if isinstance(end, Done):
                for c in responder.final_chunks(end, include_usage):
                    yield sse.data(c)
            else:
                yield sse.data(_engine_error(end).body())
            yield sse.data("[DONE]")
        finally:
            job.cancel.set()  # the client left (or we are done): stop within a layer's work


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
    chunks, size = [], 0
    async for c in request.stream():
        size += len(c)
        if size > limit:
            raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
        chunks.append(c)
    return b"".join(chunks)


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already, so the
    next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _engine_error(e: BaseException) -> ApiError:
    if isinstance(e, ServerStopping):
        return ApiError(503, str(e), code="server_shutting_down")
    if isinstance(e, EngineError) and e.code == MP_ECTX:
        return ApiError(400, str(e), code="context_length_exceeded")
    code = e.format_code if isinstance(e, EngineError) else None  # a container rule it broke
    return ApiError(500, f"generation failed: {e}", code=code or "engine_error")


def create_app(cfg: ServeConfig) -> tuple[ASGIApp, Server]:
    srv = Server(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        srv.loop = asyncio.get_running_loop()
        yield
        srv.close()

    app = FastAPI(title="moepack serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = srv

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        return ApiError(e.status_code, str(e.detail)).response()

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect) -> Response:
        # it left mid-body or mid-generation: nobody reads this (499, as nginx logs it); a
        # handled exception, so no traceback in the log
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _any_error(request: Request, e: Exception) -> JSONResponse:
        return ApiError(500, f"internal error: {type(e).__name__}").response()

    @app.get("/")
    async def page() -> Response:
        return HTMLResponse(srv.page, headers=page_headers(srv.page))

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        # browsers ask for it beside the page: "no icon" rather than a 404 in every log
        return Response(status_code=204)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": cfg.model_id, "queue_depth": srv.worker.waiting,
                "busy": srv.worker.pending > 0, "ctx": srv.engine.ctx}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        srv.check_key(request)
        text = srv.metrics.render(srv.worker.engine_stats, srv.worker.waiting,
                                  srv.worker.pending > 0)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    def model_card() -> dict:
        return {"id": cfg.model_id, "object": "model", "created": srv.started,
                "owned_by": "moepack", "context_length": srv.engine.ctx}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        srv.check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict:
        srv.check_key(request)
        if model_id != cfg.model_id:
            raise ApiError(404, f"The model {model_id!r} does not exist", param="model",
                           code="model_not_found")
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req = await srv.parse(request, ChatRequest)
        job, mode = await srv.prepare(srv.prep.chat, req)
        responder = ChatResponder(cfg.model_id, ChatOutput(mode.family, list(mode.names),
                                                           mode.forced), bool(req.logprobs))
        srv.submit(job)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse.response(srv.stream(job, responder, responder.first_chunk(), usage))
        pieces, done = await srv.collect(job, request)
        return JSONResponse(responder.whole(pieces, done))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await srv.parse(request, CompletionRequest)
        job = await srv.prepare(srv.prep.completion, req)
        responder = CompletionResponder(cfg.model_id, req.logprobs is not None)
        srv.submit(job)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse.response(srv.stream(job, responder, None, usage))
        pieces, done = await srv.collect(job, request)
        return JSONResponse(responder.whole(pieces, done))

    return _CountRequests(app, srv.metrics), srv
