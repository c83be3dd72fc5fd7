"""Where Robocode is, and the working directory it plays in: the robot compiled and placed, the
turn budget, the ``.battle`` files, and the java command line."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

from sacbot.robocode import ROBOT

SETUP_HINT = "run ./tools/setup.sh robocode (Debian's robocode, libmsgpack-java and default-jdk-headless)"
# Robocode 1.9.3.9 on Java 17 fails to start without these (it reflects into the JDK).
ADD_OPENS = ("--add-opens=java.base/sun.net.www.protocol.jar=ALL-UNNAMED",
             "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
             "--add-opens=java.desktop/sun.awt=ALL-UNNAMED")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROBOT_SOURCES = (os.path.join(REPO, "clients", "java", "sacbot", "SacbotClient.java"),
                 os.path.join(REPO, "clients", "robocode", "sacbot", "SacbotRobot.java"))


class RobocodeMissing(Exception):
    """Robocode, a JDK or msgpack-core's jar is not there: the message says what and how to get it."""


@dataclass
class Install:
    jar: str  # robocode.jar
    data: str  # the folder with robots/sample and config/
    msgpack_jar: str
    java: str
    javac: str


def _dpkg_files(package: str) -> list[str]:
    try:
        done = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def find_install(robocode: str | None = None, java: str = "java") -> Install:
    """``robocode``: a Robocode folder (robocode.jar in it or in its libs/, and robots/sample); None:
    Debian's package, as ``dpkg -L robocode`` lists it."""
    if robocode:
        if not os.path.isdir(robocode):
            raise RobocodeMissing(f"--robocode {robocode!r} is not a directory")
        jars = [p for p in (os.path.join(robocode, "robocode.jar"), os.path.join(robocode, "libs", "robocode.jar"))
                if os.path.isfile(p)]
        if not jars:
            raise RobocodeMissing(f"--robocode {robocode!r} holds no robocode.jar (nor libs/robocode.jar)")
        jar, data = jars[0], robocode
    else:
        files = _dpkg_files("robocode")
        jar = next((f for f in files if f.endswith("/robocode.jar") and os.path.isfile(f)), None)
        data = next((os.path.dirname(os.path.dirname(os.path.dirname(f))) for f in files
                     if f.endswith("/robots/sample/SittingDuck.class")), None)
        if jar is None or data is None:
            raise RobocodeMissing(f"Robocode is not installed (dpkg -L robocode lists no robocode.jar): {SETUP_HINT}, "
                                  "or pass --robocode DIR")
    if not os.path.isdir(os.path.join(data, "robots", "sample")):
        raise RobocodeMissing(f"{data!r} has no robots/sample folder: the sample robots are needed as opponents")
    jars = sorted(glob.glob("/usr/share/java/msgpack-core*.jar"))
    if not jars:
        raise RobocodeMissing(f"msgpack-core's jar (/usr/share/java/msgpack-core.jar) is missing: {SETUP_HINT}")
    javac = shutil.which("javac")
    java_path = shutil.which(java)
    if javac is None or java_path is None:
        raise RobocodeMissing(f"a JDK (java and javac) is missing: {SETUP_HINT}")
    return Install(jar=jar, data=data, msgpack_jar=jars[0], java=java_path, javac=javac)


def sample_robots(inst: Install) -> list[str]:
    return sorted("sample." + os.path.basename(p)[:-len(".class")]
                  for p in glob.glob(os.path.join(inst.data, "robots", "sample", "*.class")) if "$" not in p)


def prepare_workdir(inst: Install, workdir: str, turn_budget_ms: float) -> None:
    """Robocode's working directory: its config (with this turn budget), the sample robots, and
    this robot compiled from its sources.  Idempotent; the robot is compiled anew each time."""
    missing = [p for p in ROBOT_SOURCES if not os.path.isfile(p)]
    if missing:
        raise RobocodeMissing(f"the robot's sources are missing ({', '.join(missing)}): sacbot robocode runs from a "
                              "checkout of sacbot (or an editable install of one)")
    os.makedirs(os.path.join(workdir, "config"), exist_ok=True)
    robots = os.path.join(workdir, "robots")
    if not os.path.isdir(os.path.join(robots, "sample")):
        shutil.copytree(os.path.join(inst.data, "robots", "sample"), os.path.join(robots, "sample"))
    # Robocode measures robocode.cpu.constant (the time a robot's turn may take, in ns) on its first
    # start when it is missing; a fixed one makes the budget a choice, the same on every machine.
    with open(os.path.join(workdir, "config", "robocode.properties"), "w", encoding="utf-8") as f:
        f.write(f"robocode.cpu.constant={int(turn_budget_ms * 1e6)}\n"
                "robocode.options.common.showResults=false\nrobocode.options.battle.desiredTPS=10000\n")
    out = os.path.join(robots, "sacbot")
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([inst.javac, "-Xlint:all", "-Werror", "-cp", f"{inst.jar}{os.pathsep}{inst.msgpack_jar}",
                           "-d", robots, *ROBOT_SOURCES], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"javac failed to compile the robot:\n{done.stderr.strip()}")
    with open(os.path.join(out, "SacbotRobot.properties"), "w", encoding="utf-8") as f:
        f.write(f"robot.classname={ROBOT}\nrobot.name=SacbotRobot\nrobot.author.name=sacbot\n"
                "robot.description=Driven by sacbot serve: one observation a turn, one action back\n"
                "robot.java.source.included=false\n")
    # Robocode keeps a database of the robots it found; a stale one may miss a robot compiled anew.
    for name in ("robot.database",):
        try:
            os.remove(os.path.join(robots, name))
        except FileNotFoundError:
            pass


def write_battle(path: str, robots: list[str], rounds: int, width: int = 800, height: int = 600) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"robocode.battleField.width={width}\nrobocode.battleField.height={height}\n"
                f"robocode.battle.numRounds={rounds}\nrobocode.battle.gunCoolingRate=0.1\n"
                "robocode.battle.rules.inactivityTime=450\nrobocode.battle.hideEnemyNames=false\n"
                f"robocode.battle.selectedRobots={','.join(robots)}\n")


def java_command(inst: Install, workdir: str, battle: str, results: str, tps: int, props: dict[str, str]) -> list[str]:
    return [inst.java, "-Xmx512M", "-Djava.awt.headless=true", "-DNOSECURITY=true", *ADD_OPENS,
            f"-DWORKINGDIRECTORY={workdir}", *(f"-D{k}={v}" for k, v in props.items()),
            "-cp", f"{inst.jar}{os.pathsep}{inst.msgpack_jar}", "robocode.Robocode",
            "-battle", battle, "-nodisplay", "-nosound", "-tps", str(tps), "-results", results]
