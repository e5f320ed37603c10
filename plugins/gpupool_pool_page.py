"""The "GPU pool" page: an Airflow 3 plugin (a FastAPI app plus a nav entry).

Both the page and its JSON API sit behind Airflow's own authentication: a request needs the
UI's session cookie or an `Authorization: Bearer` token, exactly like the REST API. If that
guard cannot be imported the app fails closed (503 on every request); it publishes no OpenAPI
schema or docs pages.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

try:  # the dependency that resolves the caller from Airflow's JWT (cookie or bearer)
    from airflow.api_fastapi.core_api.security import requires_authenticated

    _auth = requires_authenticated()
except ImportError as exc:  # fail closed: without Airflow's guard, serve nobody
    _why = f"authentication unavailable ({type(exc).__name__}: {exc}); the GPU pool page refuses every request"

    def _auth() -> None:
        raise HTTPException(status_code=503, detail=_why)


# no /docs, /redoc or /openapi.json: the API is described in the README, and nothing here is
# served without the guard
app = FastAPI(title="gpupool — GPU pool", dependencies=[Depends(_auth)], docs_url=None, redoc_url=None,
              openapi_url=None)


def _state(at: str | None, hours: int) -> dict:
    from gpupool import pipeline, poolview

    try:
        when = pipeline.parse_time(at) if at else None
    except pipeline.WindowError as exc:
        raise HTTPException(status_code=422, detail=f"query parameter 'at': {exc}") from None
    ctx = pipeline.Context.load()  # platforms.yaml too: the pool's owners and each platform's names of a node
    try:
        return poolview.pool_state(ctx.engine, when, hours=hours, config=ctx.config)
    except poolview.InstantError as exc:  # a time, but one whose window cannot be read
        raise HTTPException(status_code=422, detail=f"query parameter 'at': {exc}") from None
    except poolview.NoDataError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc


@app.get("/api/pool")
def pool_json(at: str | None = Query(None, description="instant to show (ISO 8601); default: newest forecast"),
              hours: int = Query(24, ge=1, le=24 * 14)) -> dict:
    """Per platform: GPUs, demand and forecast band, anomalies, open handovers, last plan, and
    who owns each owned node and who holds it."""
    return _state(at, hours)


@app.get("/", response_class=HTMLResponse)
def pool_page(at: str | None = None, hours: int = Query(24, ge=1, le=24 * 14)) -> str:
    from gpupool import poolview

    return poolview.render_html(_state(at, hours))


@app.get("/metrics")
def metrics() -> Response:
    """Prometheus metrics computed from staging at this scrape (see docs/operations/metrics.md)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from gpupool import metrics as gpupool_metrics, pipeline

    ctx = pipeline.Context.load()
    try:
        body = gpupool_metrics.exposition(ctx.engine, ctx.config)
    finally:
        ctx.engine.dispose()
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)


class GpupoolPlugin(AirflowPlugin):
    name = "gpupool"
    fastapi_apps = [{"app": app, "url_prefix": "/gpupool", "name": "GPU pool"}]
    external_views = [
        {"name": "GPU pool", "href": "/gpupool/", "destination": "nav", "category": "browse", "url_route": "gpu-pool"}
    ]
