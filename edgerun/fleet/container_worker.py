"""Worker process of the compute container (run by path with `python -I`; imports nothing from edgerun).

argv: TASK_DIR ENTRY RESULT_PATH; stdin: JSON inputs. Calls `run(inputs)` from ENTRY and writes
{"ok": true, "output": ...} or {"ok": false, "error": "..."} to RESULT_PATH.
"""

import json
import os
import runpy
import sys
import traceback


def main() -> int:
    task_dir, entry, result_path = sys.argv[1], sys.argv[2], sys.argv[3]
    inputs = json.loads(sys.stdin.read() or "null")
    sys.path.insert(0, task_dir)
    os.chdir(task_dir)
    try:
        namespace = runpy.run_path(os.path.join(task_dir, entry), run_name="__edgerun_task__")
        output = namespace["run"](inputs)
        record = {"ok": True, "output": output}
        text = json.dumps(record)
    except BaseException:  # the task's own fault, whatever it is, becomes a failure report
        text = json.dumps({"ok": False, "error": traceback.format_exc(limit=5)})
        code = 1
    else:
        code = 0
    with open(result_path + ".tmp", "w") as f:
        f.write(text)
    os.replace(result_path + ".tmp", result_path)
    return code


if __name__ == "__main__":
    sys.exit(main())
