"""The simulator's own API: the clock, the whole pool, and provisioning (moving a released node).

Moving a node between platforms is, in a real datacenter, the job of a provisioning system
(re-imaging, re-registration) between the release at the source and the node showing up at the
target. This API plays that system:

* ``GET  /sim/v1/clock`` — ``{"now", "start", "end", "step", "speed"}``
* ``POST /sim/v1/clock/advance`` ``{"by": "1h"}`` — move the clock forward (on top of wall time)
* ``GET  /sim/v1/pool`` — every node's owner, state and running work
* ``POST /sim/v1/nodes/{name}/move`` ``{"to": "kubernetes"}`` — 409 unless the node is released
  (drained/cordoned/disabled at its platform) and empty; answers when it will arrive
* ``POST /sim/v1/nodes/{name}/mig`` ``{"layout": "all-1g.10gb"}`` — a node-side MIG tool run on the
  node (what ``python -m gpupool.emulator.migparted`` sends): 409 unless the node is held and empty
  at its platform, 422 for a GPU without MIG; answers once the layout is applied
* ``POST /sim/v1/nodes/{name}/power`` ``{"on": false}`` — a BMC's reset: off at once (409 while the
  node runs work), on after ``minutes`` (default the scenario's ``parking.wake_minutes``, else 10)
* ``GET  /sim/v1/summary`` — the study's numbers so far (``World.summary``)
"""

from __future__ import annotations

import json

import pandas as pd
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.state import SimConflict, SimInvalid, SimNotFound, SimState


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message}}, status_code=status)


def _jsonable(rec: dict) -> dict:
    out = {}
    for k, v in rec.items():
        if k == "meta":
            continue
        out[k] = str(v) if isinstance(v, pd.Timestamp) else v
    return out


def make_app(state: SimState) -> Starlette:
    """The control app over ``state``."""

    def clock_body() -> dict:
        return {"now": state.now.isoformat(), "start": state.world.start.isoformat(),
                "end": state.world.end.isoformat(), "step": str(state.step), "speed": state.speed}

    async def clock(request: Request):
        with state.lock:
            state.sync()
            return JSONResponse(clock_body())

    async def advance(request: Request):
        try:
            body = json.loads(await request.body() or b"{}")
            by = pd.Timedelta(body["by"])
        except (ValueError, KeyError, TypeError):
            return _error(400, 'body must be {"by": "<duration>"}, e.g. {"by": "1h"}')
        if by < pd.Timedelta(0):
            return _error(422, "the clock only moves forward")
        with state.lock:
            state.advance(by)
            return JSONResponse(clock_body())

    async def pool(request: Request):
        with state.lock:
            state.sync()
            return JSONResponse({"now": state.now.isoformat(), "nodes": [_jsonable(n) for n in state.pool()]})

    def node_action(name: str, act, answer, status: int = 200):
        """Run ``act()`` on node ``name`` under the lock, the state's refusals as 404/422/409."""
        with state.lock:
            state.sync()
            try:
                result = act()
            except SimNotFound:
                return _error(404, f"node {name} not found")
            except SimInvalid as exc:
                return _error(422, str(exc))
            except SimConflict as exc:
                return _error(409, str(exc))
            return JSONResponse({"node": name, **answer(result), "now": state.now.isoformat()}, status_code=status)

    async def move(request: Request):
        name = request.path_params["name"]
        try:
            body = json.loads(await request.body() or b"{}")
            to = body["to"]
            if not isinstance(to, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error(400, 'body must be {"to": "<platform>"}')
        return node_action(name, lambda: state.move(name, to), lambda arrive: {"to": to, "arrive": arrive.isoformat()},
                           202)

    async def node_mig(request: Request):
        name = request.path_params["name"]
        try:
            body = json.loads(await request.body() or b"{}")
            layout = body["layout"]
            if not isinstance(layout, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error(400, 'body must be {"layout": "<MIG configuration>"}')
        return node_action(name, lambda: state.apply_mig_on_node(name, layout), lambda _: {"layout": layout})

    async def node_power(request: Request):
        name = request.path_params["name"]
        try:
            body = json.loads(await request.body() or b"{}")
            on, minutes = body["on"], body.get("minutes")
            if not isinstance(on, bool) or (minutes is not None and (isinstance(minutes, bool)
                                                                     or not isinstance(minutes, (int, float)))):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return _error(400, 'body must be {"on": true|false} with an optional "minutes": <number>')
        return node_action(name, lambda: state.power(name, on, None if minutes is None else float(minutes)),
                           lambda done: {"on": on, "done": done.isoformat()}, 202)

    async def summary(request: Request):
        with state.lock:
            state.sync()
            return JSONResponse(state.world.summary())

    return Starlette(routes=[
        Route("/sim/v1/clock", clock, methods=["GET"]),
        Route("/sim/v1/clock/advance", advance, methods=["POST"]),
        Route("/sim/v1/pool", pool, methods=["GET"]),
        Route("/sim/v1/nodes/{name}/move", move, methods=["POST"]),
        Route("/sim/v1/nodes/{name}/mig", node_mig, methods=["POST"]),
        Route("/sim/v1/nodes/{name}/power", node_power, methods=["POST"]),
        Route("/sim/v1/summary", summary, methods=["GET"]),
    ])
