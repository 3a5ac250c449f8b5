"""``lmdepth explore`` (lmdepth.book.explore_app): the explorer served by Voilà and used from headless Chromium, as a
reader would — the page loads offline, a typed prompt changes the numbers drawn, nothing throws, the page's text
shows no error and no raw MyST role, its charts draw, and the server stops cleanly (its kernel too, its folder
removed).

Chromium is driven over its DevTools protocol (a websocket: websocket-client, a dependency of nnsight) because
typing into a widget and waiting for the kernel's answer needs a live page, which ``--dump-dom`` cannot give.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from lmdepth.book import explore_app, explore_server
from lmdepth.book.defects import chromium_exe
from lmdepth.charts import vega_offline
from lmdepth.errors import LmDepthError
from lmdepth.results import TMP_PREFIX
from lmdepth.runtime import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, timeout: float, step: float = 0.5):
    end = time.time() + timeout
    while time.time() < end:
        got = check()
        if got:
            return got
        time.sleep(step)
    return None


class Page:
    """One headless Chromium tab driven over the DevTools protocol, every host but 127.0.0.1 unresolvable."""

    def __init__(self, profile: Path):
        import websocket

        port = _free_port()
        self.chrome = subprocess.Popen(
            [chromium_exe(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1200,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def tabs():
            try:
                return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2))
            except OSError:
                return None

        listed = _wait(tabs, 30, 0.2)
        assert listed, "headless Chromium did not open its DevTools port"
        self.ws = websocket.create_connection(next(t for t in listed if t["type"] == "page")["webSocketDebuggerUrl"])
        self.n, self.events = 0, []
        self.call("Runtime.enable")
        self.call("Log.enable")

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True).get("result", {}).get("value")

    def errors(self) -> list[str]:
        """JavaScript exceptions, console errors and failed loads seen so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "") + " " + str(p["exceptionDetails"].get("exception", {})
                                                                              .get("description", ""))[:300])
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description", "")))[:300] for a in p.get("args", [])))
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"{p['entry']['text']} {p['entry'].get('url', '')}")
        return out

    def close(self) -> None:
        self.ws.close()
        self.chrome.terminate()
        self.chrome.wait(timeout=30)


#: The longest a page may take to show its form once the server said a kernel is ready (2.5-3.5 s measured beside
#: two training runs and a test suite on 2 cores; 41-59 s when the page's own kernel ran the notebook).
FORM_WITHIN_S = 15
#: Type ``prompt`` into the explorer's prompt box (the widget syncs on ``input``) and press Run.
TYPE_AND_RUN = """(() => {
  const box = document.querySelector('textarea');
  box.value = %s;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  [...document.querySelectorAll('button')].find(b => b.textContent.trim() === 'Run').click();
})()"""
#: What the page says to a reader: its rendered text, and how many charts were drawn (an svg in a chart's div).
PAGE_TEXT = "document.body.innerText"
CHARTS_DRAWN = "document.querySelectorAll('.lmdepth-vega svg').length"
#: A MyST role as Markdown shows it when no MyST parser reads it, e.g. {doc}`01_residual_norms`.
RAW_ROLE = re.compile(r"\{[\w:-]+\}`")
#: The logit-lens table the widget drew for the last Run, once it differs from ``before``.
LENS_TABLE = """(() => {
  const t = document.querySelector('.widget-output table');
  return t && t.innerText !== %s ? t.innerText : null;
})()"""


@pytest.mark.unit
def test_the_server_command_and_its_page_template(tmp_path):
    """The command serves on 127.0.0.1 only, without jupytext's lab extension and the code, with our template; the
    template keeps Voilà's lab page less its CDN stylesheets; the notebook carries the reader's parameters."""
    notebook = explore_app.prepare(tmp_path, {"prompt": "two plus two is", "skip_layer": 2})
    cmd = explore_app.voila_command(notebook, 9999)
    assert cmd[1:4] == ["-m", explore_server.MODULE, str(notebook)] and "--Voila.ip=127.0.0.1" in cmd
    assert "--no-browser" in cmd and f"--Voila.connection_dir_root={tmp_path}" in cmd  # Voilà's files in the folder
    assert "--VoilaConfiguration.extension_denylist=jupyterlab-jupytext" in cmd and "--strip_sources=True" in cmd
    assert "--preheat_kernel=True" in cmd and "--pool_size=1" in cmd  # a kernel kept ready: the form in seconds
    template = tmp_path / "voila" / "templates" / explore_app.TEMPLATE
    assert json.loads((template / "conf.json").read_text()) == {"base_template": "lab"}
    index = (template / "index.html.j2").read_text()
    lab = Path(sys.prefix, "share", "jupyter", "voila", "templates", "lab", "index.html.j2").read_text()
    cdn = re.findall(r'<link rel="stylesheet" href="https://[^"]+" type="text/css" />', lab)
    assert len(cdn) == 2 and all(f"replace('{link}', '')" in index for link in cdn)  # each removed, as written there
    import nbformat

    injected = [c.source for c in nbformat.read(notebook, as_version=4).cells
                if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "prompt = \"two plus two is\"" in injected[0] and "skip_layer = 2" in injected[0]
    assert explore_app.environment(tmp_path)["JUPYTER_PATH"].split(":")[0] == str(tmp_path)
    # the charts are the book's HTML snippet, drawn by the book's bundle, which the page loads from the template
    assert explore_app.environment(tmp_path)[vega_offline.HTML_ONLY_ENV] == "1"
    assert (template / "static" / vega_offline.BUNDLE_NAME).read_text() == vega_offline.bundle_js()
    assert f'resources.include_js("static/{vega_offline.BUNDLE_NAME}")' in index
    last = nbformat.read(notebook, as_version=4).cells[-1]  # says on the server's terminal that a kernel is ready
    assert last.cell_type == "code" and repr(explore_app.READY_LINE) in last.source and "__stderr__" in last.source
    markdown = "".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "markdown")
    assert "chapter 01" in markdown and not RAW_ROLE.search(markdown)  # roles read as their text
    with pytest.raises(LmDepthError, match="skip_layers"):  # a misspelt parameter: one line, before any server
        explore_app.prepare(tmp_path, {"skip_layers": 2})


@pytest.mark.unit
def test_roles_read_as_their_text():
    assert explore_app.plain_roles("see chapter {doc}`01 <01_residual_norms>`, {doc}`method` and {ref}`Method "
                                   "<method-states>`; `code` stays") == "see chapter 01, method and Method; `code` stays"


@pytest.mark.unit
def test_with_html_charts_set_a_chart_is_the_html_snippet_alone(monkeypatch):
    """Voilà's JupyterLab vega renderer writes "Javascript Error: e.setData is not a function" under each chart (it
    stores a PNG into the read-only output); with the app's setting a chart is the book's snippet only."""
    import altair as alt
    import pandas as pd

    vega_offline.enable()
    chart = alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_point().encode(x="x:Q")
    assert vega_offline.VEGALITE_MIMETYPE in chart._repr_mimebundle_()[0]
    monkeypatch.setenv(vega_offline.HTML_ONLY_ENV, "1")
    bundle = chart._repr_mimebundle_()[0]
    assert set(bundle) == {"text/html", "text/plain"} and 'class="lmdepth-vega"' in bundle["text/html"]


@pytest.mark.unit
@pytest.mark.parametrize("port", [-1, 0, 70000])
def test_a_port_out_of_range_is_refused_in_one_line_before_anything_starts(port, monkeypatch):
    import tempfile

    from lmdepth.book import cli, explore_app

    monkeypatch.setattr(explore_app, "require_voila", lambda: None)
    made = f"{TMP_PREFIX}{explore_server.FOLDER_LABEL}*"
    before = set(Path(tempfile.gettempdir()).glob(made))
    assert cli.main(["explore", "--port", str(port)]) == 2
    assert set(Path(tempfile.gettempdir()).glob(made)) == before  # no folder left


@pytest.mark.unit
def test_a_taken_port_is_refused_instead_of_serving_another_one():
    import socket

    from lmdepth.book.explore_app import check_port, voila_command
    from lmdepth.errors import ParameterError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ParameterError, match=f"port {port} on 127.0.0.1 is not free"):
            check_port(port)
    assert check_port(port) == port  # free again
    assert "--ServerApp.port_retries=0" in voila_command(Path("x.ipynb"), port)  # Voilà never moves elsewhere


#: ``lmdepth explore``'s part in a process of its own: a marked temporary folder with a one-cell notebook, and the
#: server started on it as :func:`lmdepth.book.explore_app.serve` starts it (:func:`explore_server.run`).
EXPLORE_PARENT = """
import os, sys
import nbformat
from lmdepth.book.explore_server import FOLDER_LABEL, MODULE, run
from lmdepth.results import temp_dir

folder = temp_dir(sys.argv[1], FOLDER_LABEL)
notebook = folder / "explorer.ipynb"
nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), notebook)
print(folder, flush=True)
run([sys.executable, "-m", MODULE, str(notebook), f"--port={sys.argv[2]}", "--Voila.ip=127.0.0.1", "--no-browser",
     f"--Voila.connection_dir_root={folder}"], folder, os.environ)
"""


def _status(pid: int) -> dict[str, str]:
    """/proc/<pid>/status as a mapping (empty once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="the server ends with its parent through Linux's PDEATHSIG")
def test_a_sigkill_of_lmdepth_explore_leaves_no_server_and_no_folder(tmp_path):
    """``lmdepth explore`` killed with SIGKILL: its server gets SIGTERM from Linux and removes the folder itself (its
    maker is gone). It used to stay in /tmp with the notebook, the template and Voilà's connection files."""
    parent = subprocess.Popen([sys.executable, "-c", EXPLORE_PARENT, str(tmp_path), str(_free_port())],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        folder = Path(parent.stdout.readline().strip())
        assert folder.is_dir() and folder.name.startswith(TMP_PREFIX + explore_server.FOLDER_LABEL)
        children = lambda: subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True,  # noqa: E731
                                          text=True).stdout.split()
        server = int(_wait(children, 30, 0.05)[0])
        # killed once the server catches SIGTERM (from its first line on): a kill while it starts up counts too
        assert _wait(lambda: int(_status(server).get("SigCgt", "0"), 16) >> (signal.SIGTERM - 1) & 1, 30, 0.05)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    assert _wait(lambda: _status(server).get("State", "Z").startswith("Z"), 30, 0.1), "the server outlived it"
    assert not folder.exists()


@pytest.mark.unit
def test_the_next_start_removes_the_folders_of_servers_killed_before_they_could(tmp_path):
    """Both processes SIGKILLed leave the folder: the next start removes it once the process that made it is gone;
    a running explorer's folder, and a user's folder of the same name without the marker, are kept."""
    from lmdepth.results import TEMP_MARKER, temp_dir

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    left, running = temp_dir(tmp_path, explore_server.FOLDER_LABEL), temp_dir(tmp_path, explore_server.FOLDER_LABEL)
    marker = json.loads((left / TEMP_MARKER).read_text())
    (left / TEMP_MARKER).write_text(json.dumps({**marker, "pid": dead}))
    mine = tmp_path / f"{TMP_PREFIX}{explore_server.FOLDER_LABEL}mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's")
    assert explore_server.sweep(tmp_path) == [left]
    assert not left.exists() and running.is_dir() and (mine / "notes.txt").is_file()


@pytest.mark.unit
def test_without_voila_the_command_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "voila" else real(name, *a))
    from lmdepth.book.cli import main

    with pytest.raises(LmDepthError, match=r"needs voila, not installed here: pip install 'voila>=0\.5,<0\.6' "
                                           r"'ipywidgets>=8'"):
        explore_app.require_voila()
    assert main(["explore", "--port", "1"]) == 2
    import tomllib

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert tuple(extras["explore"]) == explore_app.REQUIREMENTS  # the line names what the extra installs


@pytest.mark.browser  # and the packaged SmolLM2: the explorer's model
def test_a_typed_prompt_changes_what_the_live_explorer_draws(tmp_path):
    if chromium_exe() is None:
        pytest.fail("headless Chromium is needed: `apt install chromium` (scripts/test.sh does it where it may)")
    port, log = _free_port(), tmp_path / "server.log"
    with log.open("w") as err:  # a file, not a pipe: nothing reads the server's log while the page runs
        server = subprocess.Popen([sys.executable, "-m", "lmdepth.book.cli", "explore", "--port", str(port)],
                                  stderr=err, cwd=tmp_path)
    page, folder = None, None
    try:
        named = _wait(lambda: re.search(rf"{re.escape(explore_server.MODULE)} (\S+)/explorer\.ipynb", log.read_text()), 60)
        assert named, log.read_text()
        folder = Path(named[1])
        assert folder.is_dir() and folder.name.startswith(TMP_PREFIX + explore_server.FOLDER_LABEL)
        # the kept-ready kernel runs the notebook (model load, the static example) before any page asks: tens of
        # seconds on 2 cores; once it says so, a page shows its form in seconds (41-59 s without it)
        assert _wait(lambda: explore_app.READY_LINE in log.read_text(), 240), log.read_text()[-3000:]
        page = Page(Path(tempfile.mkdtemp(dir=tmp_path)))
        opened = time.monotonic()
        page.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        assert _wait(lambda: page.js("!!document.querySelector('textarea')"), 60), "the explorer's form never appeared"
        assert time.monotonic() - opened < FORM_WITHIN_S, f"the form took {time.monotonic() - opened:.0f} s"
        assert _wait(lambda: page.js(CHARTS_DRAWN), 60), "the static example's chart was not drawn"
        text = page.js(PAGE_TEXT)
        assert "Error" not in text and "failed" not in text, text[:3000]  # e.g. "Javascript Error: …" under a chart
        assert not RAW_ROLE.search(text), RAW_ROLE.search(text)
        page.js(TYPE_AND_RUN % json.dumps("The capital of France is"))
        first = _wait(lambda: page.js(LENS_TABLE % json.dumps("")), 120)
        assert first and first.startswith("layer\ttop 1"), first
        page.js(TYPE_AND_RUN % json.dumps("def fibonacci(n):"))
        second = _wait(lambda: page.js(LENS_TABLE % json.dumps(first)), 120)
        assert second and second.startswith("layer\ttop 1") and second != first  # the new prompt's own numbers
        assert _wait(lambda: page.js(CHARTS_DRAWN) >= 2, 30), "the Run's chart was not drawn"
        text = page.js(PAGE_TEXT)
        assert "Error" not in text and "failed" not in text and not RAW_ROLE.search(text), text[:3000]
        assert page.errors() == []
    finally:
        if page is not None:
            page.close()
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0, log.read_text()  # Voilà stopped on the forwarded SIGTERM and shut its kernel down
    assert not folder.exists()  # the notebook and template folder removed
    left = subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, text=True).stdout.split()
    assert left == []  # neither the server nor its kernel outlived it
