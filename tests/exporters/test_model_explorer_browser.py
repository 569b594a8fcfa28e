"""The Model Explorer export opened in Model Explorer itself: the package's own server on
127.0.0.1 (`model-explorer graph.json --node_data_paths=... --no_open_in_browser`), its web app
in headless Chromium (tests/support/browser.py), which must load the graph and the overlays."""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from tests.support.paths import EXAMPLES

pytest.importorskip("model_explorer")

# the app's stylesheet asks Google Fonts for its typeface; the page is checked without it
FONT_HOSTS = {"fonts.gstatic.com", "fonts.googleapis.com"}
STARTUP_S = 90  # the server imports torch (a pytorch adapter) before it listens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def explorer_server(tmp_path):
    """The tiny model's export served by Model Explorer: (app URL, graph JSON, overlays)."""
    out = tmp_path / "graph.json"
    args = ["export", "--config", str(EXAMPLES / "tiny.yaml"), "--format", "model-explorer"]
    r = CliRunner().invoke(main, [*args, "-t", "4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    overlays = [tmp_path / f"graph.{m}.json" for m in ("flops", "bytes", "time")]
    port = free_port()
    cmd = [sys.executable, "-m", "model_explorer", str(out)]
    cmd += [f"--node_data_paths={','.join(map(str, overlays))}", "--no_open_in_browser"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    # read in a thread: a server that never prints its address fails the test, not hangs it
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        url, seen = None, []
        while url is None:
            try:
                line = lines.get(timeout=STARTUP_S)
            except queue.Empty:
                pytest.fail(f"model-explorer printed no address in {STARTUP_S} s: {seen}")
            seen.append(line)
            m = re.search(rf"(http://127\.0\.0\.1:{port}/\S*)", line)
            url = m.group(1) if m else None
        yield url, json.loads(out.read_text()), [json.loads(p.read_text()) for p in overlays]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_model_explorer_draws_the_graph_and_loads_the_overlays(explorer_server, open_page):
    url, doc, overlays = explorer_server
    view = open_page(url, allow_hosts=("127.0.0.1",), viewport=(1400, 900))
    page = view.page
    # the side panel lists each overlay once the app has read it
    for name in ("FLOPs", "bytes moved", "predicted time (s)"):
        page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    nodes = len(doc["graphs"][0]["nodes"])
    body = page.inner_text("body")
    assert f"{nodes} nodes" in body
    # the aggregated stats are computed by the app from the overlay it loaded
    flops = overlays[0]["graphllm"]["results"]
    assert f"Sum\t{sum(v['value'] for v in flops.values())}" in body
    # the graph's top level, drawn on the app's WebGL canvas: the `model` layer and the LM head
    assert page.locator("canvas").count() > 0
    root = body.split("Root-level nodes stats", 1)[1].split("Node data", 1)[0]
    assert "\tmodel\t" in root and "\tlm_head\t" in root
    # the only thing missing is the blocked web font; the app itself reports no error
    assert {urlsplit(u).hostname for u in view.blocked} <= FONT_HOSTS
    app_errors = [e for e in view.errors if not e.startswith("Failed to load resource")]
    assert app_errors == []
