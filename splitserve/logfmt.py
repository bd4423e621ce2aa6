"""The two log formats, applied by the entry points only (never at import):

- text: `2025-01-01 12:00:00,000 decode[0] INFO decode_worker: ...`, for a terminal;
- json: one JSON object per line (`ts`, `level`, `process` as role[index], `logger`, `message`,
  plus the structured fields a record carries, such as the access log's), for log shippers.

SPLITSERVE_LOG_LEVEL and SPLITSERVE_LOG_FORMAT give the defaults of every process's
--log-level and --log-format, so `splitserve serve --log-format json` reaches its children.
"""

from __future__ import annotations

import json
import logging
import sys
import time

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
LEVEL_ENV = "SPLITSERVE_LOG_LEVEL"
FORMAT_ENV = "SPLITSERVE_LOG_FORMAT"
# a record's structured fields, for the json format (the access log's come as extra={"access":})
STRUCTURED = ("access", "warmup")


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "process": self.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in STRUCTURED:
            value = getattr(record, key, None)
            if isinstance(value, dict):
                out.update(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def level_number(level: str) -> int:
    if level.lower() not in LEVELS:
        raise ValueError(f"log level {level!r}: one of {', '.join(LEVELS)}")
    return getattr(logging, level.upper())


def configure(process: str, level: str = "info", fmt: str = "text") -> None:
    """Log to stderr as `process` (e.g. "decode[0]") at `level`, in format `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_number(level))
