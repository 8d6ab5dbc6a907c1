"""The MNN converter's own process: reads one conversion per line on stdin, answers one line on the reply
channel. Run as a script (`python -I convert_child.py CONVERTER_DIR`): it imports nothing of edgerun.

Why a process of its own: MNN's converter spills weights to a scratch file with a fixed name in the
current directory (`.__convert_external_data.bin`), so every conversion must run with its partition's own
folder as the working directory, and changing directory in the caller's process would move every thread
of it. Here `chdir` is private, and a converter that aborts takes only this process down.

Request: a JSON list `[folder, arg, ...]`. Reply: `ok` or `error <text>`. The converter prints on fd 1,
which points at `folder/convert.log` during a conversion; replies go to the original stdout.
"""

import json
import os
import sys


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # what MNN prints on import (its CPU features) must not reach the reply channel
    os.close(quiet)
    sys.path.insert(0, sys.argv[1])
    import _tools  # MNN's converter binding (never MNN.tools: its wrapper runs pip and sends usage data)

    for line in sys.stdin:
        folder, *args = json.loads(line)
        os.chdir(folder)
        log = os.open(os.path.join(folder, "convert.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        try:
            _tools.mnnconvert(args)
            reply = "ok"
        except Exception as exc:  # the binding's own errors; an abort ends the process instead
            reply = "error " + " ".join(str(exc).split())
        sys.stdout.flush()
        os.chdir("/")
        replies.write(reply + "\n")


if __name__ == "__main__":
    main()
