package sacbot;

import java.util.Random;

/**
 * A hand-written policy on {@link SacbotRobot}'s own observation and action, with no server: what that interface
 * allows, against which a learnt bot is judged. It locks the radar on the enemy, turns the gun by the observation's
 * angle to the lead (o[19]), fires when that angle is under {@code scripted.tolerance} degrees, and (unless
 * {@code scripted.move} is false) drives perpendicular to the enemy, reversing every 10-40 turns and away from the
 * walls. Every number it reads is one the learner sees, and every order goes through the robot's own action mapping.
 * Used by {@code tools/bench/robocode_scripted.py}; system properties: {@code scripted.power} (the fire power, 2),
 * {@code scripted.tolerance} (2), {@code scripted.move} (true), {@code scripted.seed} (1); with {@code sacbot.gun=lead}
 * or {@code gated} the gun's action is 0, which follows the lead through the robot's own mapping.
 */
public class ScriptedRobot extends SacbotRobot {
    static final double POWER = Double.parseDouble(System.getProperty("scripted.power", "2.0"));
    static final double TOLERANCE_DEG = Double.parseDouble(System.getProperty("scripted.tolerance", "2.0"));
    static final boolean MOVE = Boolean.parseBoolean(System.getProperty("scripted.move", "true"));

    // One generator for the battle: Robocode makes a new robot object each round but keeps the class.
    private static final Random RNG = new Random(Long.getLong("scripted.seed", 1L));
    private int direction = 1;
    private int untilReverse;

    @Override
    public void run() {
        setAdjustGunForRobotTurn(true);
        setAdjustRadarForGunTurn(true);
        while (true) {
            double[] o = observe();
            double[] a = policy(o, fireValue(POWER), TOLERANCE_DEG);
            if (GUN_LEAD) {
                a[2] = 0;
            }
            if (MOVE) {
                move(o, a);
            }
            apply(a);
            execute();
        }
    }

    /** The action's fire value for a bullet of this power (the inverse of the robot's mapping). */
    static double fireValue(double power) {
        return (power - robocode.Rules.MIN_BULLET_POWER)
                / (robocode.Rules.MAX_BULLET_POWER - robocode.Rules.MIN_BULLET_POWER);
    }

    /** Radar, gun and fire from one observation, standing still: a pure function. */
    static double[] policy(double[] o, double fireValue, double toleranceDeg) {
        double[] a = new double[ACT];
        if (o[21] <= 0) { // no enemy seen yet: sweep the radar
            a[3] = 1;
            a[4] = -1;
            return a;
        }
        // Twice the angle to the enemy: the radar overshoots it and sweeps back, holding the lock.
        a[3] = clamp(2 * o[20] * Math.PI / robocode.Rules.RADAR_TURN_RATE_RADIANS);
        a[2] = clamp(o[19] * Math.PI / robocode.Rules.GUN_TURN_RATE_RADIANS);
        a[4] = Math.abs(o[19]) * 180.0 < toleranceDeg ? fireValue : -1;
        return a;
    }

    private void move(double[] o, double[] a) {
        if (o[21] <= 0) {
            return;
        }
        if (--untilReverse <= 0) {
            direction = -direction;
            untilReverse = 10 + RNG.nextInt(30);
        }
        double x = o[0];
        double y = o[1];
        double want;
        if (Math.max(Math.abs(x), Math.abs(y)) > 0.8) { // near a wall: head for the centre
            want = robocode.util.Utils.normalRelativeAngle(Math.atan2(-x, -y) - Math.atan2(o[2], o[3]));
            direction = Math.abs(want) > Math.PI / 2 ? -1 : 1;
        } else {
            want = robocode.util.Utils.normalRelativeAngle(Math.atan2(o[11], o[12]) - Math.PI / 2);
        }
        // Driving backwards serves as well as turning round.
        if (want > Math.PI / 2) {
            want -= Math.PI;
        } else if (want < -Math.PI / 2) {
            want += Math.PI;
        }
        a[1] = clamp(want / robocode.Rules.MAX_TURN_RATE_RADIANS);
        a[0] = direction;
    }

    private static double clamp(double v) {
        return Math.max(-1.0, Math.min(1.0, v));
    }
}
