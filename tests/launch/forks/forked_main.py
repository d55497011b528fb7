"""What tests/launch/forks/test_server.py runs in a forked proc instead of Monarch's proc main, as __main__.

FORKED=report: print what the proc sees (pid, parent, $FOO, cwd, whether torch came preloaded), exit 3.
FORKED=wait: write the pid to $FORKED_PIDFILE, exit 7 on SIGTERM, else wait (60 s at most)."""

import json
import os
import signal
import sys
import time

if __name__ == "__main__":
    if os.environ["FORKED"] == "report":
        seen = {"pid": os.getpid(), "ppid": os.getppid(), "foo": os.environ.get("FOO"), "cwd": os.getcwd()}
        seen["torch"] = "torch" in sys.modules
        print(json.dumps(seen), flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    with open(os.environ["FORKED_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
