"""One rank of a spawned test: ``python _worker.py module:function result.json [args...]``.

Imports ``tests.runtime.<module>``, calls the function with the remaining arguments and writes its
return value as JSON. An exception propagates (non-zero exit, traceback on stderr).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    target, result_path, *args = sys.argv[1:]
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(f"tests.runtime.{module_name}"), function_name)
    result = function(*args)
    Path(result_path).write_text(json.dumps(result))
