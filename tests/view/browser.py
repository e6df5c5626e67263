"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: fd 3 in, fd 4 out,
JSON messages ended by NUL), so the tests need no port, no network and no Python package beyond the standard library.

It records what a person's browser would show as going wrong: uncaught exceptions, console errors, log errors, and
every network request a page makes (a site that opens from disk makes only file: ones).
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]
HANG_S = 120.0  # a guard against a hung browser, never a verdict about speed


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> None:
    """Skip the calling test module without chromium, except in CI, where scripts/setup.sh installs it: there its
    absence is an error."""
    import pytest

    if chromium() is not None:
        return
    if os.environ.get("CI"):
        raise RuntimeError("chromium is missing in CI: scripts/setup.sh installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (scripts/setup.sh installs it as root: apt-get install chromium)",
                allow_module_level=True)


class Browser:
    def __init__(self, executable: str):
        self.profile = tempfile.mkdtemp(prefix="spolake-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes the replies
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        preexec_fn=wire, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + HANG_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("chromium sent nothing for a long time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        while True:
            event = self._read()
            self.events.append(event)
            if event.get("method") == method:
                return event

    def open(self, path: Path) -> None:
        """Load the page and wait for its load event, then let its scripts (charts) run."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        self.eval("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """JavaScript errors since the page was opened: uncaught exceptions, console.error, log entries of level error."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params["exceptionDetails"])[:400])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(json.dumps(params.get("args"))[:400])
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"].get("text", "")[:400])
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, width: int = 1280, height: int = 900) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        shot = self.call("Page.captureScreenshot", session=True, format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError, TimeoutError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)
