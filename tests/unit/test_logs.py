"""corral.logs: the record format (logfmt quoting, JSON), the settings, the quiet libraries;
corral._logfile: one file many processes append to and rotate, read back and followed.

The file tests run real writer processes (``python -c``), as a host's actors are."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral import logs
from corral._exceptions import ConfigError
from corral._logfile import log_lines, rotated
from corral.config import LoggingSettings


def _record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            info = sys.exc_info()
    record = logging.LogRecord("corral.test", logging.WARNING, __file__, 1, msg, args, info)
    record.__dict__.update(extra)
    return record


def test_logfmt_quotes_only_what_needs_it_as_json_strings() -> None:
    line = logs.Formatter("dispatch").format(_record('said "hi" to %s\nthen =x', "a b"))
    fields = logs.parse_logfmt(line)
    assert line.startswith("ts=")
    assert " level=warning proc=dispatch pid=" in line
    assert ' logger=corral.test msg="said \\"hi\\" to a b\\nthen =x"' in line
    assert "\n" not in line
    assert fields["msg"] == 'said "hi" to a b\nthen =x'
    assert logs.logfmt_value("plain") == "plain"
    assert logs.logfmt_value("") == '""'
    assert logs.logfmt_value("a\\b") == '"a\\\\b"'
    assert logs.logfmt_value(3) == "3"
    assert logs.logfmt_value(None) == "null"
    assert logs.logfmt_value(["x", 1]) == '"[\\"x\\", 1]"'


# A loaded machine (other test runs) slows input generation: that is no failure of ours.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.text(), max_size=5))
def test_any_text_survives_a_logfmt_round_trip(values: list[str]) -> None:
    fields = {f"k{i}": v for i, v in enumerate(values)}
    assert logs.parse_logfmt(logs.to_logfmt(fields)) == fields


def test_a_traceback_is_a_field_of_its_one_record_in_both_formats() -> None:
    record = _record("it failed", exc=True)
    line = logs.Formatter("harness").format(record)
    assert "\n" not in line
    exc = logs.parse_line(line)["exc"]  # type: ignore[index]
    assert exc.startswith("Traceback (most recent call last):\n")
    assert exc.endswith("ValueError: bad\nvalue")
    document = json.loads(logs.Formatter("harness", "json").format(record))
    assert document["exc"] == exc
    assert list(document)[:7] == ["ts", "level", "proc", "pid", "logger", "msg", "exc"]


def test_extra_fields_and_the_session_of_a_worker() -> None:
    worker = logs.Formatter("worker", session="s-1")
    fields = logs.parse_line(worker.format(_record("hi", turn="t 1")))
    assert fields is not None
    assert list(fields) == ["ts", "level", "proc", "pid", "session", "logger", "msg", "turn"]
    assert (fields["proc"], fields["session"], fields["turn"]) == ("worker", "s-1", "t 1")
    own = logs.parse_line(logs.Formatter("dispatch").format(_record("x", session="s-2")))
    assert own is not None and own["session"] == "s-2"


def test_parse_line_reads_both_formats_and_refuses_other_lines() -> None:
    record = _record("x")
    text = logs.parse_line(logs.Formatter("host").format(record))
    js = logs.parse_line(logs.Formatter("host", "json").format(record))
    assert text is not None and js is not None
    assert text["msg"] == js["msg"] == "x"
    assert logs.parse_line("Traceback (most recent call last):") is None
    assert logs.parse_line('ts=1 level=info msg="torn') is None
    assert logs.parse_line("{not json") is None


def test_the_level_variable_is_validated_naming_it() -> None:
    assert logs.resolve(LoggingSettings(), {"CORRAL_LOG_LEVEL": "DEBUG"}).level == "debug"
    with pytest.raises(ConfigError, match=r"^invalid CORRAL_LOG_LEVEL 'verbose': expected") as exc:
        logs.resolve(LoggingSettings(), {"CORRAL_LOG_LEVEL": "verbose"})
    assert exc.value.key == "CORRAL_LOG_LEVEL"
    # A child handed nothing (or something broken) falls back instead of dying.
    assert logs.handed_over({"CORRAL_LOG_LEVEL": "verbose"}) == LoggingSettings()
    assert logs.handed_over({"CORRAL_LOG": "{"}) == LoggingSettings()
    handed = LoggingSettings(level="error", format="json")
    assert logs.handed_over(logs.child_env(handed)) == handed


def test_setup_quiets_libraries_and_a_strict_file_error_names_the_key(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.setup("host", LoggingSettings(level="debug"))
        assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("hypercorn.error").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("corral.x").getEffectiveLevel() == logging.DEBUG
        blocked = tmp_path / "file"
        blocked.write_text("")
        bad = LoggingSettings(file=str(blocked / "corral.log"))
        with pytest.raises(ConfigError, match=r"^invalid config: logging\.file: ") as exc:
            logs.setup("host", bad, strict=True)
        assert exc.value.key == "logging.file"
        logs.setup("host", bad)  # not strict: stderr only
        assert len(root.handlers) == 1
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


_WRITER = """
import logging, sys
from corral import logs
from corral.config import LoggingSettings
logs.setup(sys.argv[1], LoggingSettings(file=sys.argv[2], max_bytes=int(sys.argv[3]),
                                        backups=int(sys.argv[4])))
for i in range(int(sys.argv[5])):
    logging.getLogger("corral.writer").info("record %d of a writer", i)
"""


def _writers(path: Path, count: int, records: int, *, max_bytes: int, backups: int):
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                f"w{n}",
                str(path),
                str(max_bytes),
                str(backups),
                str(records),
            ],
            stderr=subprocess.DEVNULL,
        )
        for n in range(count)
    ]


def test_writers_in_several_processes_rotate_one_file_and_lose_no_record(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "corral.log"
    procs = _writers(path, 3, 300, max_bytes=4000, backups=200)
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    assert rotated(path, 2).exists(), "it rotated more than once"
    seen = [logs.parse_line(line) for line in log_lines(path)]
    assert None not in seen, "every line is one whole record"
    keys = sorted((f["proc"], f["msg"]) for f in seen if f)
    assert keys == sorted(
        (f"w{n}", f"record {i} of a writer") for n in range(3) for i in range(300)
    )
    # Writers check the size and write under a shared lock, so each may add its record to a
    # file another one just filled: a file ends at most one record per writer past the limit.
    assert all(p.stat().st_size <= 4000 + 3 * 200 for p in path.parent.glob("corral.log*"))
    assert path.stat().st_mode & 0o777 == 0o600


def test_rotation_keeps_only_backups_files(tmp_path: Path) -> None:
    path = tmp_path / "corral.log"
    procs = _writers(path, 1, 200, max_bytes=1000, backups=2)
    assert procs[0].wait(60) == 0
    assert sorted(p.name for p in tmp_path.glob("corral.log*")) == [
        "corral.log",
        "corral.log.1",
        "corral.log.2",
        "corral.log.lock",
    ]
    last = [logs.parse_line(line) for line in log_lines(path)][-1]
    assert last is not None and last["msg"] == "record 199 of a writer"


def test_following_reads_what_other_processes_append_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "corral.log"
    path.write_text("")
    deadline = time.monotonic() + 60
    lines = log_lines(path, follow=True, stop=lambda: time.monotonic() > deadline)
    assert next(lines) == "", "an empty log is caught up at once"
    procs = _writers(path, 2, 150, max_bytes=3000, backups=100)
    got = []
    for line in lines:
        got.append(logs.parse_line(line))
        if len(got) == 300:
            break
    assert [p.wait(60) for p in procs] == [0, 0]
    assert rotated(path, 1).exists()
    assert None not in got
    assert len({(f["proc"], f["msg"]) for f in got if f}) == 300, "each record once"
