#!/usr/bin/env bash
# Create .venv (if missing) and install sacbot with the given extras (comma-separated), e.g.
#   ./tools/setup.sh train      # what `sacbot run` needs
#   ./tools/setup.sh test       # the test suite
#   ./tools/setup.sh java       # the OS packages of the Java client of `sacbot serve` (clients/java/)
#   ./tools/setup.sh robocode   # Robocode, msgpack for Java and a JDK, for `sacbot robocode` (docs/robocode.md)
# torch comes first, as the machine's own build: these machines keep a CPU wheel of torch 2.13.0
# on disk, and pyproject's range (torch>=2.1,<3) is then already satisfied; left to the range
# alone, pip would fetch the newest release, a multi-GB CUDA build.  SACBOT_TORCH overrides the
# version asked for here (empty: leave torch to the range).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
# `java` is no pip extra: it installs what clients/java/ and its test need from the distribution, a
# JDK and msgpack-core's jar, when javac, java or the jar is missing.  Given alone, it does only that.
# `robocode` is no pip extra either: Debian's Robocode (its robocode.jar and sample robots), msgpack-core's
# jar and a JDK, when any of them is missing.  It implies `java`.
# Installs Debian packages with apt-get (sudo when not root); asked only when something is missing.
apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -q
    $sudo apt-get install -y -q "$@"
}
# Takes an OS-level name out of the pip extras; exits when nothing is left for pip.
drop_extra() {
    extras="$(echo ",$extras," | sed "s/,$1,/,/g; s/^,//; s/,$//")"
    if [ -z "$extras" ]; then exit 0; fi
}
case ",$extras," in
    *,robocode,*)
        if ! dpkg -s robocode >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1 \
                || ! ls /usr/share/java/msgpack-core*.jar >/dev/null 2>&1; then
            apt_install robocode libmsgpack-java default-jdk-headless
        fi
        drop_extra robocode ;;
esac
case ",$extras," in
    *,java,*)
        if ! command -v javac >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1 \
                || ! ls /usr/share/java/msgpack-core*.jar >/dev/null 2>&1; then
            apt_install default-jdk-headless libmsgpack-java
        fi
        drop_extra java ;;
esac
torch_spec="${SACBOT_TORCH-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
case ",$extras," in
    *,train,*|*,test,*|*,ray,*|*,bench,*)
        if [ -n "$torch_spec" ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
            .venv/bin/python -m pip install -q "$torch_spec"
        fi ;;
esac
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
