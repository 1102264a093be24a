"""A real headless Chromium (Debian's package, `make test` installs it: scripts/ensure-chromium) driven
over the DevTools protocol: pages load as a user's browser loads them, scripts and frames included.

Screenshots go to `$DELTADRAIN_TEST_ARTEFACTS/<test name>` when that is set, else to the test's own
tmp directory (pytest keeps the last three runs' under /tmp/pytest-of-<user>/)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# What DevTools answers an evaluation that a navigation overtook: the page it ran in is gone, so a poll asks again.
NAVIGATED = ("Inspected target navigated or closed", "Execution context was destroyed",
             "Cannot find context with specified id")


def chromium_binary() -> str:
    found = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    assert found, "no Chromium: `make test` installs Debian's package (scripts/ensure-chromium)"
    return found


def artefacts_dir(tmp_path: Path, test_name: str) -> Path:
    root = os.environ.get("DELTADRAIN_TEST_ARTEFACTS")
    out = Path(root) / test_name if root else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


class DevToolsError(AssertionError):
    """A DevTools command answered with an error."""


class Browser:
    """One Chromium with one tab; `call` sends a DevTools command and returns its result, and the
    events that arrive meanwhile are kept in `events`."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        self.profile, self._stack = profile, contextlib.ExitStack()
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a profile used before: not that port
        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--mute-audio",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._connect(width, height)
        except BaseException:
            self.close()
            raise

    def _connect(self, width: int, height: int) -> None:
        from websockets.sync.client import connect

        port_file, deadline = self.profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            assert self.proc.poll() is None, f"chromium exited: {self.proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port within 60 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        self.ws = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30))
        self.n, self.events = 0, []
        self.call("Page.enable")
        self.call("Network.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise DevToolsError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 90, what: str = ""):
        """The value of `expression` once it is truthy (polled)."""
        deadline = time.monotonic() + timeout
        while True:
            # A DOM node (of any frame) is not sent back by value: only whether there is one.
            try:
                value = self.evaluate(f"(() => {{ const v = ({expression}); "
                                      "return v && typeof v === 'object' && 'nodeType' in v ? true : v; })()")
            except DevToolsError as e:
                if not any(m in str(e) for m in NAVIGATED):
                    raise
                value = None
            if value:
                return value
            assert time.monotonic() < deadline, f"waited {timeout} s for {what or expression}"
            time.sleep(0.25)

    def go(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def log_in(self, api) -> None:
        """Log in through Airflow's own login page as `api`'s user (an AirflowApi), typing as a user does."""
        self.go(f"{api.base_url}/auth/login/?next={urllib.parse.quote(api.base_url + '/')}")
        self.wait_for("document.querySelector('input[name=\"username\"]')", what="Airflow's login form")
        for field, value in (("username", api.username), ("password", api.password)):
            self.evaluate(f"document.querySelector('input[name=\"{field}\"]').focus()")
            self.call("Input.insertText", text=value)
        self.evaluate("document.querySelector('button[type=\"submit\"]').click()")
        self.wait_for("location.pathname.indexOf('/auth/') < 0", what="the login to go through")

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))
        return path

    def requested_hosts(self) -> set[str]:
        """The hosts of every request the tab made (http and websockets): nothing may come from elsewhere."""
        urls = [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]
        return {urllib.parse.urlsplit(u).netloc for u in urls if urllib.parse.urlsplit(u).scheme in ("http", "https")}

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
