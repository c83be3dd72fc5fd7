"""How long `sacbot run` takes to act on SIGTERM, per pace and learner (the goal in BENCHMARKS.md:
within 1 s).

For each case, start a run, wait until it is in the state where a stop is hardest (realtime: inside a
20 s tick sleep at --tps 0.05; lockstep: UTD 4, learning, mid-episode), send SIGTERM and time
two things: until the run says it is closing (the signal was acted on), and until the process
has exited with its final save written.  Medians over --repeats.  The last line is JSON.

    python tools/bench/shutdown.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CASES = {
    "realtime-0.05tps": ["--env", "Pendulum-v1", "--pace", "realtime", "--tps", "0.05"],
    # Pendulum's episodes are 200 steps: learning starts at 250, the signal comes ~1 s later, so
    # the run is mid-episode (an older sacbot finished the episode first).
    "lockstep-pendulum-utd4": ["--env", "Pendulum-v1", "--pace", "lockstep", "--utd-ratio", "4",
                               "--learning-starts", "250"],
}


def one(case: str, learner: str, against: str | None = None) -> dict:
    """``against``: a checkout of older sacbot to run instead (no --learner there)."""
    with tempfile.TemporaryDirectory() as d:
        args = [sys.executable, "-m", "sacbot", "run", *CASES[case], "--run-dir",
                os.path.join(d, "run"), "--weights-path", os.path.join(d, "w"), "--quiet"]
        if against is None:
            args += ["--learner", learner]
        env = {**os.environ, "PYTHONPATH": against} if against else None
        p = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        seen: dict[str, float] = {}
        ready = threading.Event()

        def read():
            for line in p.stderr:
                if "learning started" in line:
                    ready.set()
                if "closing" in line:
                    seen["closing"] = time.monotonic()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        if not case.startswith("realtime"):  # realtime: the first tick (its heartbeat) is enough
            ready.wait(120)
        status = os.path.join(d, "run", "status.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(status) and time.monotonic() < deadline:
            time.sleep(0.05)  # the first tick writes the heartbeat
        time.sleep(1.0)  # well inside the tick (or the episode) when the signal comes
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(120)
        t.join(5)
        saved = os.path.exists(os.path.join(d, "w", "sac_latest.zip"))
        return {"acted_on_s": round(seen.get("closing", float("nan")) - t0, 3),
                "exited_s": round(time.monotonic() - t0, 3), "code": p.returncode, "final_save": saved}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--learners", default="thread,process")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--against", help="also time an older checkout (e.g. a git worktree of 7cba3ad), side by side")
    a = ap.parse_args()
    out = {}
    for case in a.cases.split(","):
        kinds = a.learners.split(",") + (["old"] if a.against else [])
        for learner in kinds:
            runs = [one(case, learner, a.against if learner == "old" else None) for _ in range(a.repeats)]
            out[f"{case}/{learner}"] = {
                "acted_on_s_median": statistics.median(r["acted_on_s"] for r in runs),
                "exited_s_median": statistics.median(r["exited_s"] for r in runs),
                "all_exit_0_with_final_save": all(r["code"] == 0 and r["final_save"] for r in runs), "runs": runs}
            print(case, learner, out[f"{case}/{learner}"], file=sys.stderr)
    print(json.dumps({"bench": "shutdown", "repeats": a.repeats, **out}))


if __name__ == "__main__":
    main()
