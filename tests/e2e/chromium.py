"""A minimal DevTools client for the browser tests: headless Chromium, an optional session
cookie, navigate, read the text, measure the layout at given viewport widths, screenshot."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests

#: the page's layout, measured in the browser: the document's scroll width against the viewport,
#: and each card's box against the boxes of the charts and tables inside it
GEOMETRY_JS = """(() => {
  const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width}; };
  return JSON.stringify({
    viewport: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    cards: [...document.querySelectorAll('.card')].map((card) => ({
      platform: card.dataset.platform, box: box(card),
      charts: [...card.querySelectorAll('svg')].map(box),
      tables: [...card.querySelectorAll('table')].map(box),
    })),
  });
})()"""


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def render(chromium: str, url: str, *, cookie: tuple[str, str, str] | None = None,
           widths: tuple[int, ...] = ()) -> tuple[str, bytes, dict[int, dict]]:
    """``(text, png, geometry)`` of ``url``: its text once loaded, a full-page screenshot at the
    window's size and, per width of ``widths``, :data:`GEOMETRY_JS`'s measures with the viewport
    set to that width. ``cookie``: ``(name, value, base url)`` set before navigating."""
    import websocket

    profile = tempfile.mkdtemp(prefix="gpupool-chromium-")
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1400,1000", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.time() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.time() > deadline or proc.poll() is not None:
                raise AssertionError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        pages = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
        page = next(p for p in pages if p.get("type") == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        counter = iter(range(1, 10_000))

        def call(method, **params):
            msg_id = next(counter)
            ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == msg_id:
                    if "error" in msg:
                        raise AssertionError(f"{method}: {msg['error']}")
                    return msg.get("result", {})

        def evaluate(expression):
            return call("Runtime.evaluate", expression=expression, returnByValue=True).get("result", {}).get("value", "")

        call("Network.enable")
        if cookie is not None:
            name, value, base = cookie
            call("Network.setCookie", name=name, value=value, url=base, path="/")
        call("Page.enable")
        call("Page.navigate", url=url)
        deadline = time.time() + 30
        text = ""
        while time.time() < deadline:
            ready, _, text = evaluate("document.readyState + '|' + document.body.innerText").partition("|")
            if ready == "complete" and text:
                break
            time.sleep(0.3)
        shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        geometry = {}
        for width in widths:
            call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
            time.sleep(0.2)  # one layout pass
            geometry[width] = json.loads(evaluate(GEOMETRY_JS))
        ws.close()
        return text, base64.b64decode(shot["data"]), geometry
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def layout_problems(geometry: dict) -> list[str]:
    """What is wrong with one width's measures: a page wider than its viewport, a chart or a
    table reaching out of its card (half a pixel of rounding allowed). Empty: nothing."""
    slack = 0.5
    out = []
    if geometry["scrollWidth"] > geometry["viewport"]:
        out.append(f"the page scrolls sideways: {geometry['scrollWidth']} px wide in a {geometry['viewport']} px viewport")
    for card in geometry["cards"]:
        b = card["box"]
        if b["right"] > geometry["viewport"] + slack:
            out.append(f"card {card['platform']} ends at {b['right']:.0f} px, past the viewport")
        for kind in ("charts", "tables"):
            for inner in card[kind]:
                if inner["left"] < b["left"] - slack or inner["right"] > b["right"] + slack:
                    out.append(f"card {card['platform']}: a {kind[:-1]} spans {inner['left']:.0f}-{inner['right']:.0f} px, "
                               f"outside its card's {b['left']:.0f}-{b['right']:.0f} px")
    return out
