"""The dashboard's HTTP app: a JSON API over a runs folder, and the page that draws it.

Reading is open on loopback; writing (reviews) always needs the token, and so does everything
under `/api` when the server listens beyond loopback. Open reads are served only to requests
addressed to a loopback name (the `Host` header): a web page whose domain an attacker re-points at
127.0.0.1 (DNS rebinding) sends its own domain there and is refused. Run ids are paths relative to
the runs folder: anything that would leave it is refused.
"""

from __future__ import annotations

import json
import re
import secrets
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentscope_rft.dashboard.episodes import (
    EpisodeNotFound,
    check_review_targets,
    episode_detail,
    export_reviews,
    list_episodes,
)
from agentscope_rft.dashboard.hosts import host_name, is_loopback
from agentscope_rft.dashboard.runs import (
    RunNotFound,
    RunRef,
    discover_runs,
    find_run,
    metrics_payload,
    summarize,
)
from agentscope_rft.monitor.records import MetricsFileError
from agentscope_rft.review.store import ReviewError, ReviewStore, parse_review

MAX_REVIEW_BYTES = 1 << 20
"""A review request larger than this is refused (413) before it is parsed or stored."""
STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}


def create_app(root: Path, *, token: str, open_reads: bool = True) -> FastAPI:
    """The dashboard app over the runs folder `root`.

    Args:
        root: The runs folder (or one run folder).
        token: The secret a write (and, without `open_reads`, any API read) must carry, as
            `Authorization: Bearer <token>`, header `X-Dashboard-Token`, or `?token=`.
        open_reads: Serve the read API without the token (loopback binds).

    Example:
        >>> app = create_app(Path("runs"), token="s3cret")  # doctest: +SKIP
        >>> uvicorn.run(app, host="127.0.0.1", port=8765)  # doctest: +SKIP
    """
    if not token:
        raise ValueError("the dashboard needs a token for writes")
    root = root.resolve()
    app = FastAPI(title="agentscope-rft dashboard", docs_url=None, redoc_url=None)
    static = resources.files("agentscope_rft.dashboard") / "static"

    def authorized(request: Request) -> bool:
        given = request.headers.get("x-dashboard-token") or request.query_params.get("token")
        bearer = request.headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            given = bearer[7:].strip()
        # As bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 401).
        return bool(given) and secrets.compare_digest(str(given).encode(), token.encode())

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if path.startswith("/api/"):
            writing = request.method not in ("GET", "HEAD")
            host = request.headers.get("host")
            foreign = bool(host) and not is_loopback(host_name(str(host)))
            if open_reads and not writing and foreign and not authorized(request):
                return JSONResponse(
                    {
                        "error": f"reading without the token is served only to loopback "
                        f"names, and this request is addressed to {host!r} (a guard "
                        "against DNS rebinding): open http://localhost:<port>/ or "
                        "http://127.0.0.1:<port>/, or send the dashboard token"
                    },
                    status_code=403,
                )
            if (writing or not open_reads) and not authorized(request):
                what = "writing" if writing else "reading (the dashboard listens beyond loopback)"
                return JSONResponse(
                    {
                        "error": f"{what} needs the dashboard token: open the URL the "
                        "dashboard printed (it carries ?token=...) or send the header "
                        "'Authorization: Bearer <token>'"
                    },
                    status_code=401,
                )
        response: Response = await call_next(request)
        return response

    def run(run_id: str) -> RunRef:
        try:
            return find_run(root, run_id)
        except PermissionError as exc:
            raise HTTPException(403, str(exc)) from None
        except RunNotFound as exc:
            raise HTTPException(404, str(exc)) from None

    # Starlette's own (an unknown path, a wrong method) answer in the same shape as ours.
    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_query(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{e['loc'][-1]}: {'required' if e['type'] == 'missing' else e['msg']}"
            for e in exc.errors()
        )
        return JSONResponse({"error": f"bad query parameter(s): {problems}"}, status_code=400)

    @app.get("/")
    async def index() -> Response:
        return Response((static / "index.html").read_bytes(), media_type="text/html")

    @app.get("/static/{name}")
    async def asset(name: str) -> Response:
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no asset {name!r}")
        return Response((static / name).read_bytes(), media_type=STATIC_FILES[name])

    @app.get("/api/runs")
    async def runs() -> dict[str, Any]:
        return {"root": str(root), "runs": [summarize(ref) for ref in discover_runs(root)]}

    @app.get("/api/run/metrics")
    async def metrics(run_id: str) -> dict[str, Any]:
        ref = run(run_id)
        try:
            return metrics_payload(ref)
        except MetricsFileError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.get("/api/run/episodes")
    async def episodes(
        run_id: str, step: int | None = None, phase: str | None = None
    ) -> dict[str, Any]:
        return list_episodes(run(run_id), step, phase)

    @app.get("/api/run/episode")
    async def episode(run_id: str, rollout_id: str) -> dict[str, Any]:
        ref = run(run_id)
        try:
            return episode_detail(ref, rollout_id)
        except EpisodeNotFound as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/api/run/reviews")
    async def reviews(run_id: str) -> dict[str, Any]:
        store = ReviewStore(run(run_id).path)
        return {"id": run_id, "reviews": [r.model_dump() for r in store.current()]}

    @app.post("/api/run/reviews")
    async def add_review(run_id: str, request: Request) -> JSONResponse:
        ref = run(run_id)
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_REVIEW_BYTES:
                raise HTTPException(
                    413,
                    f"review not stored: the request is over {MAX_REVIEW_BYTES // 1024} KiB; "
                    "a review is a score, a comment or a corrected answer",
                )
        try:
            body = json.loads(raw)
        except ValueError:
            raise HTTPException(400, "the review must be a JSON object") from None
        if not isinstance(body, dict):
            raise HTTPException(400, "the review must be a JSON object")
        try:
            review = parse_review(body)
            check_review_targets(ref, review)
        except ReviewError as exc:
            raise HTTPException(422, str(exc)) from None
        store = ReviewStore(ref.path)
        try:
            review = store.append(review)
        except OSError as exc:  # a read-only run folder, a full disk
            raise HTTPException(
                500,
                f"review not stored: cannot write {store.path} ({exc.strerror or exc}); make the "
                "run folder writable for the dashboard, or free disk space",
            ) from None
        return JSONResponse(review.model_dump(), status_code=201)

    @app.get("/api/run/reviews.jsonl")
    async def reviews_export(run_id: str) -> Response:
        ref = run(run_id)
        text = "".join(json.dumps(r) + "\n" for r in export_reviews(ref))
        name = ref.id.replace("/", "_") + "-reviews.jsonl"
        # A header is Latin-1: the plain name is ASCII, RFC 6266's `filename*` the exact one.
        plain = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        return Response(
            text,
            media_type="application/x-ndjson",
            headers={
                "Content-Disposition": f'attachment; filename="{plain}"; '
                f"filename*=UTF-8''{quote(name, safe='')}"
            },
        )

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        return Response(status_code=204)

    return app
