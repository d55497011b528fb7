"""A real IPython kernel driven through jupyter_client, for tests that run cells in it."""

from __future__ import annotations

import json
import os
import signal

from jupyter_client.manager import start_new_kernel


class Kernel:
    """A fresh python3 kernel; `stop()` shuts it down."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """`env`: variables added to the kernel's environment (e.g. JPY_SESSION_NAME, the notebook's path, as
        jupyter_server sets it)."""
        extra = {"env": {**os.environ, **env}} if env else {}
        self.manager, self.client = start_new_kernel(kernel_name="python3", **extra)

    def restart(self, kill: bool = False) -> None:
        """Restart the kernel as JupyterLab's "Restart Kernel" does (or after SIGKILL, as the OOM killer ends
        one); the same client talks to the new kernel."""
        if kill:
            os.kill(self.pid, signal.SIGKILL)
            self.manager.provisioner.process.wait(30)
        self.manager.restart_kernel(now=True)
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 120) -> tuple[str, dict]:
        """Execute `code` -> (all text output, the reply content)."""
        texts: list[str] = []

        def collect(msg):
            content = msg["content"]
            if msg["msg_type"] == "stream":
                texts.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                texts.append(content["data"].get("text/plain", ""))
            elif msg["msg_type"] == "error":
                texts.append("\n".join(content["traceback"]))

        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=collect)
        return "".join(texts), reply["content"]

    def ok(self, code: str, timeout: float = 120) -> str:
        text, content = self.run(code, timeout)
        assert content["status"] == "ok", text
        return text

    def json(self, expr: str) -> object:
        """The value of `expr` in the kernel, through JSON (str() for what JSON cannot hold)."""
        out = self.ok(f"import json as _json\nprint(_json.dumps({expr}, default=str))")
        return json.loads(out.strip().splitlines()[-1])

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
