"""Progress output that fits where it goes: full plain lines when stderr is not a terminal
(a pipe, a file, CI), the live rich line on a terminal."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from sacbot.app.progress import Progress

# One plain line: elapsed time, then the driver's text, which starts with the steps and holds the
# policy version and the drops.
LINE = re.compile(r"^sacbot \d+:\d{2}:\d{2}  steps (\d+)  ret\(avg20\) .*\bv\d+\b.*\bdrops \d+")


def test_a_plain_line_is_written_whole_every_interval_and_once_more_at_close():
    out, calls = io.StringIO(), []
    long_text = "steps 7  " + "x" * 300  # far past any terminal width

    def text():
        calls.append(1)
        return long_text

    p = Progress(True, 100, stream=out, interval=0.0)
    assert not p.live  # a StringIO is no terminal
    p.update(7, text)
    p.update(8, text)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == [f"sacbot 0:00:00  {long_text}"] * 3
    assert len(calls) == 3


def test_between_intervals_the_text_is_not_even_built():
    out, calls = io.StringIO(), []
    p = Progress(True, None, stream=out, interval=3600.0)
    for i in range(1000):
        p.update(i, lambda i=i: calls.append(i) or f"steps {i}")
    assert out.getvalue() == "" and calls == []
    p.close()  # the last state, once
    assert out.getvalue() == "sacbot 0:00:00  steps 999\n" and calls == [999]


def test_quiet_prints_nothing_and_a_closed_stream_ends_progress_without_an_error():
    out = io.StringIO()
    p = Progress(False, None, stream=out, interval=0.0)
    p.update(1, lambda: "steps 1")
    p.close()
    assert out.getvalue() == ""
    gone = io.StringIO()
    p = Progress(True, None, stream=gone, interval=0.0)
    gone.close()
    p.update(1, lambda: "steps 1")  # ValueError from a closed file: swallowed, progress off
    assert not p.enabled


# The CLI with a shorter interval, so a run of a few seconds shows several lines; the module's
# attribute is read when the Progress is built.
_CLI_WITH_INTERVAL = ("import sys, sacbot.app.progress as p; p.PLAIN_INTERVAL_S = float(sys.argv[1]); "
                      "from sacbot.app.cli import main; sys.exit(main(sys.argv[2:]))")


def _eval_through_a_pipe(tmp_path, interval: float | None, episodes: int):
    cmd = ([sys.executable, "-m", "sacbot"] if interval is None else
           [sys.executable, "-c", _CLI_WITH_INTERVAL, str(interval)])
    run_dir = tmp_path / "run"
    p = subprocess.run(cmd + ["eval", "--episodes", str(episodes), "--run-dir", str(run_dir)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)  # pipes, not a terminal
    assert p.returncode == 0, p.stderr
    steps = json.load(open(run_dir / "status.json"))["ticks"]  # written at close: every act() of the run
    return [line for line in p.stderr.splitlines() if line.startswith("sacbot ") and "steps" in line], steps


@pytest.mark.timeout(120)
def test_the_cli_through_a_pipe_prints_complete_progress_lines(tmp_path):
    """`sacbot eval` (the shipped bot, from an empty dir) with stderr a pipe: every progress
    line is whole (no ellipsis, no escape codes, no carriage returns), and the last one counts
    every step of the run (status.json's ticks)."""
    lines, steps = _eval_through_a_pipe(tmp_path, 0.005, episodes=6)  # several intervals on a fast machine too
    assert len(lines) >= 3, lines
    for line in lines:
        assert LINE.match(line), line
        assert "…" not in line and "\x1b" not in line and "\r" not in line
    counts = [int(LINE.match(line).group(1)) for line in lines]
    assert counts == sorted(counts) and counts[-1] == steps


@pytest.mark.timeout(120)
def test_a_short_run_through_a_pipe_still_ends_with_one_whole_line(tmp_path):
    lines, steps = _eval_through_a_pipe(tmp_path, None, episodes=1)  # the default 10 s interval
    assert lines and LINE.match(lines[-1]), lines
    assert int(LINE.match(lines[-1]).group(1)) == steps


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_on_a_terminal_the_live_rich_line_stays(tmp_path):
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    p = subprocess.Popen([sys.executable, "-m", "sacbot", "eval", "--episodes", "1", "--run-dir",
                          str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=slave, cwd=tmp_path, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert p.wait(timeout=60) == 0
    os.close(master)
    out = b"".join(chunks).decode(errors="replace")
    assert "━" in out and "steps" in out  # rich's bar and the live text
    assert not re.search(r"^sacbot \d+:\d{2}:\d{2}  steps", out, re.M)  # no plain lines on a terminal
