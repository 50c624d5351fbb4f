"""The ASGI application: both APIs, the page at /, and what every request goes through: a body
size limit, one access-log line, CORS only when an origin is allowed, and errors as
{"error": "..."} with a 4xx status for every request the server refuses.

FastAPI (on Starlette, served by uvicorn) gives the request validation and the OpenAPI schema at
/openapi.json; eole serves with the same stack. /docs is a page of attn's own made from that
schema, because FastAPI's loads Swagger UI from a CDN and users run this offline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from attn_cli import package_version
from attn_cli.serving import api, libretranslate
from attn_cli.serving.errors import RequestError
from attn_cli.serving.server import Server

log = logging.getLogger("attn.serve")

# The page's files, served by name from the package: no request names a path on the server.
PAGE_FILES = {
    "index.html": "text/html",
    "page.js": "text/javascript",
    "page.css": "text/css",
    "docs.html": "text/html",
}


WORKER_GRACE = 2.0  # seconds, after the requests' grace, for the model workers to finish


def create_app(server: Server, cors_origins: Optional[list[str]] = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.start()
        yield
        # After uvicorn's grace for the accepted requests; a worker still decoding gets a little more.
        await asyncio.to_thread(server.stop, WORKER_GRACE)

    app = FastAPI(
        title="attn serve",
        version=package_version(),
        description="Translation with attn models: the LibreTranslate API, and attn's own under /v1.",
        lifespan=lifespan,
        docs_url=None,  # /docs is the package's own page (see _add_page)
        redoc_url=None,
    )
    app.state.server = server
    app.include_router(libretranslate.router)
    app.include_router(api.router)
    _add_page(app)
    _add_error_answers(app)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=cors_origins, allow_methods=["GET", "POST"], allow_headers=["*"]
        )
    app.add_middleware(RequestGuard, max_body_bytes=server.limits.max_body_bytes)
    return app


def _add_page(app: FastAPI) -> None:
    page = resources.files("attn_cli.serving") / "page"

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return Response((page / "index.html").read_bytes(), media_type="text/html; charset=utf-8")

    @app.get("/docs", include_in_schema=False)
    async def api_docs() -> Response:
        return Response((page / "docs.html").read_bytes(), media_type="text/html; charset=utf-8")

    @app.get("/page/{name}", include_in_schema=False)
    async def page_file(name: str) -> Response:
        if name not in PAGE_FILES:
            return JSONResponse({"error": f"no page file {name!r}"}, status_code=404)
        return Response((page / name).read_bytes(), media_type=f"{PAGE_FILES[name]}; charset=utf-8")


def _add_error_answers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": describe_validation(error)}, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        log.exception("error answering %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"the server failed to translate: {type(error).__name__}"}, status_code=500)


def describe_validation(error: RequestValidationError) -> str:
    """The first problem of a request body, named by its field: "beam_size: Input should be a valid integer"."""
    problems = []
    for problem in error.errors():
        where = [str(part) for part in problem.get("loc", ()) if part != "body"]
        if problem.get("type") == "json_invalid":
            problems.append("the body is not valid JSON")
            continue
        field = ".".join(where[:1]) + "".join(f"[{part}]" for part in where[1:2] if part.isdigit())
        problems.append(f"{field or 'body'}: {problem.get('msg', 'invalid')}")
    return "; ".join(dict.fromkeys(problems)) or "invalid request"


class RequestGuard:
    """ASGI middleware: refuse a body over `max_body_bytes` with 413 before the app reads it, and
    write one access-log line per request (client, method, path, status, milliseconds)."""

    def __init__(self, app, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [0]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            body = await self._read_body(scope, receive)
            if body is None:
                await _too_large(sending, self.max_body_bytes)
                return
            replayed = [False]

            async def receiving():
                if not replayed[0]:
                    replayed[0] = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: the client's disconnect

            await self.app(scope, receiving, sending)
        except Exception:
            # Starlette's outermost handler answers an error that escaped the app, after this
            # middleware: what it sends is a 500.
            status[0] = status[0] or 500
            raise
        finally:
            client = scope.get("client") or ("-", 0)
            milliseconds = (time.perf_counter() - started) * 1000
            log.info('%s "%s %s" %d %.1f ms', client[0], scope["method"], scope["path"], status[0], milliseconds)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The whole body, or None once it passes the limit (by its Content-Length or as it arrives)."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _too_large(send, limit: int) -> None:
    response = JSONResponse({"error": f"the body is larger than this server's {limit} bytes; send less"}, 413)
    await response({"type": "http"}, None, send)
