import java.io.File;

import robocode.control.BattleSpecification;
import robocode.control.BattlefieldSpecification;
import robocode.control.RobocodeEngine;
import robocode.control.RobotSpecification;
import robocode.control.events.BattleAdaptor;
import robocode.control.events.BattleErrorEvent;
import robocode.control.events.RoundEndedEvent;
import robocode.control.events.TurnEndedEvent;
import robocode.control.snapshot.IRobotSnapshot;
import robocode.control.snapshot.RobotState;

/**
 * Robocode's pace for one battle, through its control API: the turns played and the seconds the battle
 * took (JVM and engine start excluded), and from the first robot's console what Robocode said of its turns: the
 * turns it skipped while alive, and the rounds it was stopped for skipping turns while alive and after its death
 * (a dead robot is not waited for; its thread waking over 30 turns later is stopped too). Printed as one JSON
 * line. Used by {@code python -m sacbot.robocode.pace}:
 * <pre>java -DNOSECURITY=true ... -cp robocode.jar:msgpack-core.jar:OUT PaceProbe WORKDIR ROUNDS ROBOT,ROBOT</pre>
 */
public final class PaceProbe {
    private PaceProbe() {
    }

    public static void main(String[] args) {
        RobocodeEngine.setLogMessagesEnabled(false);
        RobocodeEngine engine = new RobocodeEngine(new File(args[0]));
        int rounds = Integer.parseInt(args[1]);
        // turns, and the turns and nanoseconds from each round's first turn to its end: a round's start
        // includes Robocode's wait for every robot to begin (up to 300 turn budgets), which is not pace.
        final long[] turns = {0, 0, 0, 0};
        final String[] error = {null};
        // the first robot's turns skipped while alive, rounds stopped while alive, rounds stopped after its death
        final long[] skips = {0, 0, 0};
        final boolean[] dead = {false};
        final String first = args[2].split(",")[0];
        engine.addBattleListener(new BattleAdaptor() {
            @Override
            public void onTurnEnded(TurnEndedEvent e) {
                if (e.getTurnSnapshot().getTurn() == 1) {
                    turns[3] = System.nanoTime();
                    dead[0] = false;
                }
                for (IRobotSnapshot r : e.getTurnSnapshot().getRobots()) {
                    if (!r.getName().startsWith(first)) {
                        continue;
                    }
                    String said = r.getOutputStreamSnapshot();
                    if (said != null) {
                        for (String line : said.split("\n")) {
                            if (line.startsWith("SYSTEM: ") && line.matches(".* skipped turn \\d+\\s*")) {
                                skips[0]++;
                            } else if (line.contains("has not performed any actions in a reasonable amount of time")) {
                                skips[dead[0] ? 2 : 1]++;
                            }
                        }
                    }
                    dead[0] = r.getState() == RobotState.DEAD;
                }
            }

            @Override
            public void onRoundEnded(RoundEndedEvent e) {
                turns[0] += e.getTurns();
                turns[1] += e.getTurns() - 1;
                turns[2] += System.nanoTime() - turns[3];
            }

            @Override
            public void onBattleError(BattleErrorEvent e) {
                error[0] = e.getError();
            }
        });
        engine.setVisible(false);
        RobotSpecification[] robots = engine.getLocalRepository(args[2]);
        if (robots.length != args[2].split(",").length) {
            System.err.println("PaceProbe: not every robot of " + args[2] + " was found");
            System.exit(2);
        }
        BattleSpecification spec = new BattleSpecification(rounds, new BattlefieldSpecification(800, 600), robots);
        long t0 = System.nanoTime();
        engine.runBattle(spec, true);
        double seconds = (System.nanoTime() - t0) / 1e9;
        engine.close();
        System.out.printf(java.util.Locale.ROOT, "{\"robots\": \"%s\", \"rounds\": %d, \"turns\": %d, \"seconds\": %.3f, "
                + "\"turns_per_s\": %.1f, \"in_round_turns_per_s\": %.1f, \"skipped_alive\": %d, "
                + "\"stopped_alive\": %d, \"stopped_dead\": %d, \"error\": %s}%n", args[2], rounds, turns[0],
                seconds, turns[0] / seconds, turns[1] / (turns[2] / 1e9), skips[0], skips[1], skips[2],
                error[0] == null ? "null" : "\"" + error[0].replace("\"", "'") + "\"");
        System.exit(0);
    }
}
