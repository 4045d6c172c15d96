"""A child for the zygote's tests: ``main()`` writes what it is to the file ``CHILD_OUT``
names (JSON), then exits with ``CHILD_EXIT``, or with ``CHILD_HOLD`` set waits for a signal.

It imports the bus's message ids at module level, as a worker's runtime does: the zygote
that preloads it has numbered nothing yet, and each forked child numbers its own."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from corral.bus._messages import new_id


def main() -> None:
    out = Path(os.environ["CHILD_OUT"])
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "threads": len(os.listdir("/proc/self/task")),
        "message_id": new_id(),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.rename(out)
    if os.environ.get("CHILD_HOLD"):
        signal.pause()
    sys.exit(int(os.environ.get("CHILD_EXIT", "0")))


if __name__ == "__main__":  # exec'd (python -m), as the zygote's fallback starts it
    main()
