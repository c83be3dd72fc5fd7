"""The Java client (clients/java/) against a server this test starts: compiled with javac, run as a
plain-Java test (sacbot.ClientTest) that exits non-zero on any failed check."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest
from test_serve import serving

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = sorted(glob.glob(os.path.join(REPO, "clients", "java", "sacbot", "*.java")))


def msgpack_jar() -> str | None:
    jars = sorted(glob.glob("/usr/share/java/msgpack-core*.jar"))
    return jars[0] if jars else None


def java_missing() -> str | None:
    missing = [t for t in ("javac", "java") if shutil.which(t) is None]
    if msgpack_jar() is None:
        missing.append("msgpack-core's jar (/usr/share/java/msgpack-core.jar)")
    return ", ".join(missing) or None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_the_java_client_plays_against_a_server(tmp_path, transport):
    missing = java_missing()
    if missing:
        pytest.skip(f"the Java client's test needs {missing}: run ./tools/setup.sh java")
    classes = tmp_path / "classes"
    cp = f"{classes}{os.pathsep}{msgpack_jar()}"
    done = subprocess.run(["javac", "-Xlint:all", "-Werror", "-cp", msgpack_jar(), "-d", str(classes), *SOURCES],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    opts = {"port": None, "socket_path": str(tmp_path / "s.sock")} if transport == "unix" else {}
    with serving(tmp_path, **opts) as server:
        where = ["--socket", opts["socket_path"]] if transport == "unix" else ["--port", str(server.port)]
        run = subprocess.run(["java", "-cp", cp, "sacbot.ClientTest", *where, "--bot", "java-test"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and "java client test: ok" in run.stdout, run.stdout + run.stderr
        bot = server.status()["bots"]["java-test"]
        # What the Java test played reached this server's bot: 20 + 5 actions over 3 episodes (the
        # third, started after a reconnect, ended by the refused step).
        assert (bot["ticks"], bot["episodes"], bot["connections"], bot["episodes_cut"]) == (25, 2, 2, 1), bot
