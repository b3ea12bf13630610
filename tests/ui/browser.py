"""Headless Chromium (Debian's `chromium` package) driven over the DevTools protocol, for the viewer tests.

Owns: starting the browser offline on loopback with a fresh profile, one page, and the few protocol
calls the tests need: navigate, evaluate, wait for a condition, click, screenshot. It speaks the
protocol over aiohttp's WebSocket client, so no browser-driver package is needed. Does not own: what
the tests look for.

The flags keep Chromium off the network (without the background-networking flags it keeps dialling out
and its connections are refused):

    async with Browser() as browser:
        await browser.goto("http://127.0.0.1:8765/")
        await browser.wait_for("document.querySelector('.turn') !== null")
        await browser.screenshot(Path("tests/artifacts/ui/viewer.png"))
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modeltap.proxy.tasks import Tasks

CHROMIUM = "/usr/bin/chromium"
APT_PACKAGES = "chromium"
OFFLINE_FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root here
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WINDOW = "--window-size=1400,1000"
# Chromium writes its DevTools port to the profile within a second or two; a loaded machine is slower.
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
POLL_S = 0.05


class Browser:
    """One headless Chromium with one page. `errors` collects uncaught page exceptions."""

    def __init__(self, *flags: str) -> None:
        """`flags` go to Chromium after the offline ones (`--host-resolver-rules=…` to name hosts)."""
        self.errors: list[str] = []
        self._flags = flags
        self._profile = Path(tempfile.mkdtemp(prefix="modeltap-chromium-"))
        self._process: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._tasks = Tasks("browser")

    async def __aenter__(self) -> Browser:
        if not await asyncio.to_thread(Path(CHROMIUM).exists):
            pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y {APT_PACKAGES}` (part of `make test`)")
        self._process = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *OFFLINE_FLAGS,
            WINDOW,
            *self._flags,
            f"--user-data-dir={self._profile}",
            "--remote-debugging-port=0",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        port = await self._devtools_port()
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as response:
            pages = [t for t in await response.json() if t["type"] == "page"]
        self._socket = await self._http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._tasks.spawn(self._read(), "devtools-reader")
        await self.call("Page.enable")
        await self.call("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._tasks.close()
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), 10)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    async def _devtools_port(self) -> int:
        marker = self._profile / "DevToolsActivePort"
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            text = await asyncio.to_thread(lambda: marker.read_text() if marker.exists() else "")
            if text.strip():
                return int(text.splitlines()[0])
            if self._process is not None and self._process.returncode is not None:
                pytest.fail(f"chromium exited with {self._process.returncode} before it listened")
            await asyncio.sleep(POLL_S)
        pytest.fail(f"chromium wrote no DevTools port within {START_TIMEOUT_S:.0f} s")

    async def _read(self) -> None:
        assert self._socket is not None
        async for message in self._socket:
            doc = json.loads(message.data)
            future = self._pending.pop(doc.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(doc)
            elif doc.get("method") == "Runtime.exceptionThrown":
                details = doc["params"]["exceptionDetails"]
                self.errors.append(
                    details.get("exception", {}).get("description") or details.get("text", "?")
                )

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools protocol command; its result, or an AssertionError with the protocol's error."""
        assert self._socket is not None
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self._socket.send_json({"id": self._next_id, "method": method, "params": params})
        doc = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        assert "error" not in doc, f"{method}: {doc['error']}"
        return dict(doc["result"])

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, f"{expression}: {result['exceptionDetails']}"
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                text = await self.evaluate("document.body.innerText")
                raise AssertionError(f"timed out waiting for {expression}; the page says:\n{text}")
            await asyncio.sleep(POLL_S)

    async def click(self, selector: str) -> None:
        found = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "if (e) e.click(); return e !== null; })()"
        )
        assert found, f"nothing matches {selector}"

    async def text(self, selector: str) -> str:
        return str(await self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''"))

    async def screenshot(self, path: Path) -> None:
        data = (await self.call("Page.captureScreenshot", format="png"))["data"]
        await asyncio.to_thread(_write, path, base64.b64decode(data))


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
