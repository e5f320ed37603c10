"""The "GPU pool" page: an Airflow 3 plugin (a FastAPI app plus a nav entry).

Both the page and its JSON API sit behind Airflow's own authentication: a request needs the
UI's session cookie or an `Authorization: Bearer` token, exactly like the REST API.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

try:  # the dependency that resolves the caller from Airflow's JWT (cookie or bearer)
    from airflow.api_fastapi.core_api.security import requires_authenticated
except ImportError:  # pragma: no cover - older layouts
    requires_authenticated = None

_guard = [Depends(requires_authenticated())] if requires_authenticated else []

app = FastAPI(title="gpupool — GPU pool", dependencies=_guard)


def _state(at: str | None, hours: int) -> dict:
    from gpupool import pipeline, poolview

    engine = pipeline.Context.load().engine
    try:
        return poolview.pool_state(engine, pipeline.parse_time(at) if at else None, hours=hours)
    except poolview.NoDataError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc


@app.get("/api/pool")
def pool_json(at: str | None = Query(None, description="instant to show (ISO 8601); default: newest forecast"),
              hours: int = Query(24, ge=1, le=24 * 14)) -> dict:
    """Per platform: GPUs, demand and forecast band, anomalies, open handovers, last plan."""
    return _state(at, hours)


@app.get("/", response_class=HTMLResponse)
def pool_page(at: str | None = None, hours: int = Query(24, ge=1, le=24 * 14)) -> str:
    from gpupool import poolview

    return poolview.render_html(_state(at, hours))


class GpupoolPlugin(AirflowPlugin):
    name = "gpupool"
    fastapi_apps = [{"app": app, "url_prefix": "/gpupool", "name": "GPU pool"}]
    external_views = [
        {"name": "GPU pool", "href": "/gpupool/", "destination": "nav", "category": "browse", "url_route": "gpu-pool"}
    ]
