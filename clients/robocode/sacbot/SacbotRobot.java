package sacbot;

import java.io.FileWriter;
import java.io.IOException;
import java.io.Writer;
import java.util.Locale;

import robocode.AdvancedRobot;
import robocode.BattleEndedEvent;
import robocode.BulletHitEvent;
import robocode.DeathEvent;
import robocode.HitByBulletEvent;
import robocode.HitWallEvent;
import robocode.RoundEndedEvent;
import robocode.Rules;
import robocode.ScannedRobotEvent;
import robocode.SkippedTurnEvent;
import robocode.WinEvent;
import robocode.util.Utils;

/**
 * A Robocode robot driven by {@code sacbot serve}: every turn it sends one observation and applies the
 * action that comes back; a round is one episode.
 *
 * <p>Configured by system properties of Robocode's JVM (which must run with {@code -DNOSECURITY=true} for the
 * socket): {@code sacbot.port} (7373), {@code sacbot.bot} ("robocode"), {@code sacbot.opponent} (the opponent's
 * name for {@code new_episode}), {@code sacbot.replyMs} (how long a reply may take, 5), {@code sacbot.helloMs}
 * (how long the hello may take at a round's start, 2000), {@code sacbot.endMs} (how long an episode's last reply
 * and {@code new_episode}'s may take, 1000), {@code sacbot.stats} (a file that gets one JSON line a round; none
 * when unset), {@code sacbot.reward} ("damage"; "energy": bullets' cost and hit bonus counted too; "dealt": the
 * damage taken not counted), {@code sacbot.gun} ("turn"; "lead": action 2 turns the gun from the lead, below;
 * "gated": as lead, and the gun fires only while it points at the lead).
 *
 * <p>Robocode waits for a robot's turn only {@code robocode.cpu.constant} ns and skips the turn after it, so a
 * reply later than {@code sacbot.replyMs} drops the connection (the server ends that episode there, nothing made
 * up) and the robot stands still for the rest of the round; it connects again at the next round's start, where
 * Robocode allows a robot 300 turns' budget to begin. A server that is gone costs one refused connect a round.
 */
public class SacbotRobot extends AdvancedRobot {
    static final int OBS = 24;
    static final int ACT = 5;
    // Reward: damage (energy) dealt minus taken, in units of REWARD_SCALE energy; the round's outcome +-1.
    static final double REWARD_SCALE = 50.0;
    // sacbot.reward=energy also counts the energy bullets cost and win back: a shot's power is charged when it is
    // fired, and a hit returns three times its power, as Robocode does.
    static final String REWARD = System.getProperty("sacbot.reward", "damage");
    static final boolean ENERGY_REWARD = "energy".equals(REWARD);
    // sacbot.reward=dealt leaves out the damage taken (bullets and walls): what the robot deals, and the outcome.
    static final boolean TAKEN_COUNTED = !"dealt".equals(REWARD);
    // sacbot.gun=lead: action 2 turns the gun from where the lead points (observation 19) rather than from where
    // it points now, so that 0 follows the lead as fast as the gun turns; before the round's first scan, as "turn".
    // sacbot.gun=gated: as lead, and a shot asked for goes off only while the gun points at the lead within the
    // enemy's half-width (a bullet fired further off misses a robot that keeps its course): the trigger waits.
    static final String GUN = System.getProperty("sacbot.gun", "turn");
    static final boolean GUN_GATED = "gated".equals(GUN);
    static final boolean GUN_LEAD = "lead".equals(GUN) || GUN_GATED;
    // The fine gun and radar angles: tanh(angle / 10 degrees).
    static final double FINE_ANGLE = Math.toRadians(10.0);
    // The lead looks at most this many turns ahead (a bullet of power 3 crosses 1,000 pixels in 91 turns).
    static final int MAX_LEAD_TURNS = 120;
    static final double HALF_ROBOT = 18.0;

    // One connection and one set of counters for the whole battle: Robocode makes a new robot object each
    // round but keeps the class, and its statics, until the battle ends.
    private static SacbotClient client;
    private static boolean gaveUp; // a refusal that another hello cannot mend (wrong spaces or settings)
    private static String lastError = "";
    // The last round's robot. Robocode may stop a robot's thread before its round's end reaches it: a dead
    // robot is no longer waited for, and when its thread wakes more than 30 turns late (a few milliseconds on
    // a busy machine) Robocode stops it for skipping turns. The next round's robot then ends that episode.
    private static SacbotRobot previous;

    // This round's state.
    private boolean episodeOpen;
    private double pendingReward;
    private boolean firstStep = true;
    private int steps;
    private int skipped;
    private int timeouts;
    private double maxReplyMs;
    private int shots;
    private int hits;
    private int blindShots; // fired before any scan of the enemy
    private double aimDegSum; // the aim errors of the other shots, in degrees
    private double fireEnergy;
    private double lastVelocity;
    private boolean seen;
    private double enemyX;
    private double enemyY;
    private double enemyHeading;
    private double enemyVelocity;
    private double enemyEnergy;
    private double enemyTurnRate; // radians a turn, from the last two scans
    private long scanTime;
    private double firePower = Rules.MAX_BULLET_POWER; // the last power asked for: it sets the lead
    private Boolean outcome;
    private boolean statsWritten;
    private boolean died;
    private boolean stopped; // Robocode stopped this robot's thread before the round's end reached it
    private int round;
    private long lastTurn;
    private double[] lastObs; // the last observation sent

    @Override
    public void run() {
        setAdjustGunForRobotTurn(true);
        setAdjustRadarForGunTurn(true);
        round = getRoundNum();
        SacbotRobot last = previous;
        previous = this;
        if (last != null) {
            last.finishStopped();
        }
        startEpisode();
        double[] action = new double[ACT];
        while (true) {
            lastTurn = getTime();
            if (episodeOpen) {
                double[] o = observe();
                double[] a = step(o, firstStep ? null : takeReward(), false, null);
                lastObs = o;
                firstStep = false;
                action = a == null ? new double[ACT] : a; // lost the server: stand still
            }
            apply(action);
            lastVelocity = getVelocity();
            execute();
        }
    }

    private void startEpisode() {
        String opponent = System.getProperty("sacbot.opponent", "");
        if (client == null && !gaveUp) {
            int port = Integer.getInteger("sacbot.port", SacbotClient.DEFAULT_PORT);
            String bot = System.getProperty("sacbot.bot", "robocode");
            SacbotClient.Box obs = new SacbotClient.Box(new int[] {OBS}, -1.0, 1.0);
            SacbotClient.Box act = new SacbotClient.Box(new int[] {ACT}, -1.0, 1.0);
            SacbotClient c = new SacbotClient("127.0.0.1", port, bot, obs, act, System.getProperty("sacbot.token"));
            // connectFor 0: a single attempt; a server that is not there costs a refused connect, not a wait.
            timeouts(c, Integer.getInteger("sacbot.replyMs", 5));
            try {
                c.connect();
                client = c;
            } catch (SacbotClient.ServerError e) {
                lastError = e.getMessage();
                gaveUp = "spaces_mismatch".equals(e.code) || "bot_refused".equals(e.code) || "auth".equals(e.code)
                        || "version".equals(e.code);
            } catch (IOException | RuntimeException e) {
                lastError = String.valueOf(e);
            }
        }
        if (client != null) {
            try {
                // A round's start has Robocode's start-up allowance: the server may still be recording the
                // last episode, so new_episode gets the longer wait too.
                timeouts(client, Integer.getInteger("sacbot.endMs", 1000));
                client.newEpisode(opponent);
                timeouts(client, Integer.getInteger("sacbot.replyMs", 5));
                episodeOpen = true;
            } catch (IOException | RuntimeException e) {
                lost(e);
            }
        }
    }

    /**
     * Ends the episode of a round whose thread Robocode stopped before the round's end reached it (called at the
     * next round's start; a stop in a battle's last round leaves the episode to the server, which ends it as
     * truncated when the connection closes). Robocode counts a stopped robot's round lost; the episode ends as
     * lost, on the last observation sent.
     */
    private void finishStopped() {
        if (statsWritten) {
            return; // the round's end reached this robot
        }
        stopped = true;
        outcome = false;
        boolean send = episodeOpen && !firstStep && client != null && lastObs != null;
        episodeOpen = false;
        writeStats(round, (int) lastTurn, send);
        if (send) {
            pendingReward -= 1.0;
            timeouts(client, Integer.getInteger("sacbot.endMs", 1000));
            step(lastObs, takeReward(), true, false);
        }
    }

    private static void timeouts(SacbotClient c, int replyMs) {
        c.timeouts(replyMs / 1000.0, Integer.getInteger("sacbot.helloMs", 2000) / 1000.0, 0.0);
    }

    private double[] step(double[] o, Double reward, boolean terminated, Boolean won) {
        long t0 = System.nanoTime();
        try {
            double[] a = client.step(o, reward, terminated, false, won);
            steps++;
            return a;
        } catch (IOException | RuntimeException e) { // a garbled reply too: the robot plays on, never throws
            if (e.getCause() instanceof java.net.SocketTimeoutException) {
                timeouts++;
            }
            lost(e);
            return null;
        } finally {
            maxReplyMs = Math.max(maxReplyMs, (System.nanoTime() - t0) / 1e6);
        }
    }

    private void lost(Exception e) {
        lastError = String.valueOf(e);
        episodeOpen = false;
        if (client != null) {
            client.disconnect();
            client = null;
        }
    }

    private double takeReward() {
        double r = pendingReward;
        pendingReward = 0.0;
        return r;
    }

    /** Ends the episode with the round's outcome (once: Robocode may report the end more than one way). */
    private void endEpisode(boolean won) {
        if (outcome != null) {
            return;
        }
        outcome = won;
        boolean send = episodeOpen && !firstStep; // a first step may not end an episode: one never begun is left
        episodeOpen = false;
        // The line first: Robocode stops a robot's thread soon after its round ends, perhaps in the wait below.
        writeStats(getRoundNum(), (int) getTime(), send);
        if (send) {
            pendingReward += won ? 1.0 : -1.0;
            // The episode's last reply may take longer (the server records the episode); the round is decided
            // and this robot dead or about to be halted, so a longer wait costs no turn that matters.
            timeouts(client, Integer.getInteger("sacbot.endMs", 1000));
            step(observe(), takeReward(), true, won);
            if (client != null) {
                timeouts(client, Integer.getInteger("sacbot.replyMs", 5));
            }
        }
    }

    /** Sets this turn's orders from an action (docs/robocode.md lists the mapping). */
    void apply(double[] a) {
        double move = clip(a[0]);
        setMaxVelocity(Math.abs(move) * Rules.MAX_VELOCITY);
        setAhead(move >= 0 ? 1e5 : -1e5);
        setTurnRightRadians(clip(a[1]) * Rules.MAX_TURN_RATE_RADIANS);
        double gunTurn = clip(a[2]) * Rules.GUN_TURN_RATE_RADIANS;
        if (GUN_LEAD && seen) {
            double toLead = Utils.normalRelativeAngle(aimBearing(getX(), getY(), getBattleFieldWidth(),
                    getBattleFieldHeight()) - getGunHeadingRadians());
            gunTurn = Math.max(-Rules.GUN_TURN_RATE_RADIANS, Math.min(Rules.GUN_TURN_RATE_RADIANS, toLead + gunTurn));
        }
        setTurnGunRightRadians(gunTurn);
        setTurnRadarRightRadians(clip(a[3]) * Rules.RADAR_TURN_RATE_RADIANS);
        double fire = clip(a[4]);
        if (fire > 0.0) { // below 0: hold fire
            firePower = Rules.MIN_BULLET_POWER + fire * (Rules.MAX_BULLET_POWER - Rules.MIN_BULLET_POWER);
            if (getGunHeat() == 0.0 && (!GUN_GATED || onTarget()) && setFireBullet(firePower) != null) {
                countShot();
            }
        }
    }

    /**
     * Whether a bullet fired now would meet the enemy where the lead puts it ({@link #onTarget(double, double)}), for
     * the power just asked for. A bullet leaves along the gun's heading before this turn's gun turn, so the gun is
     * judged where it points now; the distance is the last scan's.
     */
    boolean onTarget() {
        if (!seen) {
            return false;
        }
        double x = getX();
        double y = getY();
        return onTarget(Utils.normalRelativeAngle(aimBearing(x, y, getBattleFieldWidth(), getBattleFieldHeight())
                - getGunHeadingRadians()), Math.hypot(enemyX - x, enemyY - y));
    }

    /**
     * Whether a gun {@code off} radians from the lead hits an enemy {@code distance} pixels away: within the angle
     * its half-width spans there (at most the 45 degrees of a robot touching it). A pure function; NaN is off.
     */
    static boolean onTarget(double off, double distance) {
        return Math.abs(off) <= Math.atan2(HALF_ROBOT, Math.max(HALF_ROBOT, distance));
    }

    /**
     * Counts a bullet just fired: its energy, and how far the gun was from where the enemy will be when a bullet of
     * this power gets there (the aim error; a shot with no enemy seen yet has none).
     */
    private void countShot() {
        shots++;
        fireEnergy += firePower;
        if (ENERGY_REWARD) {
            pendingReward -= firePower / REWARD_SCALE;
        }
        if (seen) {
            double err = Utils.normalRelativeAngle(aimBearing(getX(), getY(), getBattleFieldWidth(),
                    getBattleFieldHeight()) - getGunHeadingRadians());
            aimDegSum += Math.abs(Math.toDegrees(err));
        } else {
            blindShots++;
        }
    }

    /** What the robot knows now, each value in [-1, 1] (docs/robocode.md lists them). */
    double[] observe() {
        double w = getBattleFieldWidth();
        double h = getBattleFieldHeight();
        double x = getX();
        double y = getY();
        double heading = getHeadingRadians();
        double[] o = new double[OBS];
        o[0] = 2 * x / w - 1;
        o[1] = 2 * y / h - 1;
        o[2] = Math.sin(heading);
        o[3] = Math.cos(heading);
        o[4] = getVelocity() / Rules.MAX_VELOCITY;
        o[5] = getEnergy() / 50.0 - 1;
        o[6] = getGunHeat() / 1.5 - 1; // 3 at a round's start, 1.6 after a full-power shot
        o[7] = Math.sin(getGunHeadingRadians());
        o[8] = Math.cos(getGunHeadingRadians());
        o[9] = Math.sin(getRadarHeadingRadians());
        o[10] = Math.cos(getRadarHeadingRadians());
        if (seen) {
            double dx = enemyX - x;
            double dy = enemyY - y;
            double toEnemy = Math.atan2(dx, dy); // Robocode's angles: 0 north, clockwise
            double bearing = Utils.normalRelativeAngle(toEnemy - heading);
            o[11] = Math.sin(bearing);
            o[12] = Math.cos(bearing);
            o[13] = Math.hypot(dx, dy) / 500.0 - 1;
            o[14] = Math.sin(enemyHeading);
            o[15] = Math.cos(enemyHeading);
            o[16] = enemyVelocity / Rules.MAX_VELOCITY;
            o[17] = enemyEnergy / 50.0 - 1;
            o[18] = Math.min(getTime() - scanTime, 100) / 50.0 - 1;
            // The gun's angle is to where the enemy will be when a bullet gets there, not to where it was seen:
            // a moving robot is hit only with a lead. For a robot that stands still the two are the same.
            double toAim = aimBearing(x, y, w, h);
            o[19] = Utils.normalRelativeAngle(toAim - getGunHeadingRadians()) / Math.PI;
            o[20] = Utils.normalRelativeAngle(toEnemy - getRadarHeadingRadians()) / Math.PI;
            o[21] = 1;
            // The angles again, fine near zero: a shot hits within a few degrees, which is 0.01-0.03 on the
            // scale of o[19] and a quarter or more on this one.
            o[22] = Math.tanh(Utils.normalRelativeAngle(toAim - getGunHeadingRadians()) / FINE_ANGLE);
            o[23] = Math.tanh(Utils.normalRelativeAngle(toEnemy - getRadarHeadingRadians()) / FINE_ANGLE);
        } else {
            o[13] = 1;
            o[18] = 1;
            o[21] = -1;
        }
        for (int i = 0; i < OBS; i++) {
            o[i] = clip(o[i]);
        }
        return o;
    }

    /** The bearing from (x, y) to where a bullet of the last power asked for meets the enemy ({@link #leadBearing}). */
    double aimBearing(double x, double y, double w, double h) {
        return leadBearing(x, y, enemyX, enemyY, enemyHeading, enemyVelocity, enemyTurnRate,
                Math.max(0, getTime() - scanTime), Rules.getBulletSpeed(firePower), w, h);
    }

    /**
     * The absolute bearing (0 north, clockwise) from (x, y) to where a bullet fired now at {@code bulletSpeed} meets an
     * enemy seen {@code age} turns ago at (ex, ey), if it keeps its heading's turn rate and its speed: circular
     * targeting, a straight line when it does not turn, the scan itself when it stands still. The enemy is moved a
     * turn at a time, as Robocode moves it, and held inside the w x h battlefield. A pure function of its arguments.
     */
    static double leadBearing(double x, double y, double ex, double ey, double heading, double velocity,
            double turnRate, long age, double bulletSpeed, double w, double h) {
        double px = ex;
        double py = ey;
        double ph = heading;
        for (long t = 0; t < age + MAX_LEAD_TURNS; t++) {
            if (t >= age && (t - age) * bulletSpeed >= Math.hypot(px - x, py - y)) {
                break;
            }
            px = Math.max(HALF_ROBOT, Math.min(w - HALF_ROBOT, px + velocity * Math.sin(ph)));
            py = Math.max(HALF_ROBOT, Math.min(h - HALF_ROBOT, py + velocity * Math.cos(ph)));
            ph += turnRate;
        }
        return Math.atan2(px - x, py - y);
    }

    private static double clip(double v) {
        return Double.isNaN(v) ? 0.0 : Math.max(-1.0, Math.min(1.0, v));
    }

    @Override
    public void onScannedRobot(ScannedRobotEvent e) {
        double abs = getHeadingRadians() + e.getBearingRadians();
        enemyX = getX() + e.getDistance() * Math.sin(abs);
        enemyY = getY() + e.getDistance() * Math.cos(abs);
        long since = e.getTime() - scanTime;
        // The turn rate needs two scans close together; a robot turns at most 10 degrees a turn.
        enemyTurnRate = seen && since > 0 && since <= 5
                ? Math.max(-Rules.MAX_TURN_RATE_RADIANS, Math.min(Rules.MAX_TURN_RATE_RADIANS,
                        Utils.normalRelativeAngle(e.getHeadingRadians() - enemyHeading) / since))
                : 0.0;
        seen = true;
        enemyHeading = e.getHeadingRadians();
        enemyVelocity = e.getVelocity();
        enemyEnergy = e.getEnergy();
        scanTime = e.getTime();
    }

    @Override
    public void onBulletHit(BulletHitEvent e) {
        pendingReward += Rules.getBulletDamage(e.getBullet().getPower()) / REWARD_SCALE;
        if (ENERGY_REWARD) {
            pendingReward += Rules.getBulletHitBonus(e.getBullet().getPower()) / REWARD_SCALE;
        }
        hits++;
    }

    @Override
    public void onHitByBullet(HitByBulletEvent e) {
        if (TAKEN_COUNTED) {
            pendingReward -= Rules.getBulletDamage(e.getPower()) / REWARD_SCALE;
        }
    }

    @Override
    public void onHitWall(HitWallEvent e) {
        if (TAKEN_COUNTED) {
            pendingReward -= Rules.getWallHitDamage(lastVelocity) / REWARD_SCALE;
        }
    }

    @Override
    public void onSkippedTurn(SkippedTurnEvent e) {
        skipped++;
    }

    @Override
    public void onWin(WinEvent e) {
        endEpisode(true);
    }

    @Override
    public void onDeath(DeathEvent e) {
        died = true;
        endEpisode(false);
    }

    @Override
    public void onRoundEnded(RoundEndedEvent e) {
        // Robocode may hand over the round's end before the WinEvent or the DeathEvent of the same turn: a
        // robot with energy left and no one else alive is the last survivor, which is how Robocode counts a win.
        endEpisode(!died && getEnergy() > 0 && getOthers() == 0);
        writeStats(getRoundNum(), e.getTurns(), false);
    }

    private void writeStats(int round, int turns, boolean sendsEnd) {
        if (statsWritten) {
            return;
        }
        statsWritten = true;
        String file = System.getProperty("sacbot.stats");
        if (file == null) {
            return;
        }
        try (Writer w = new FileWriter(file, true)) {
            w.write(String.format(Locale.ROOT,
                    "{\"round\": %d, \"turns\": %d, \"steps\": %d, \"skipped\": %d, \"timeouts\": %d, "
                            + "\"max_reply_ms\": %.3f, \"connected\": %b, \"won\": %b, \"sends_end\": %b, "
                            + "\"stopped\": %b, \"shots\": %d, \"hits\": %d, \"blind_shots\": %d, "
                            + "\"aim_deg_sum\": %.3f, \"fire_energy\": %.3f, \"reward\": \"%s\", \"gun\": \"%s\", "
                            + "\"error\": \"%s\"}%n",
                    round, turns, steps, skipped, timeouts, maxReplyMs, client != null, outcome, sendsEnd, stopped,
                    shots, hits, blindShots, aimDegSum, fireEnergy, REWARD, GUN,
                    lastError.replace("\\", "\\\\").replace("\"", "'")));
        } catch (IOException ignored) {
            // the stats are a measurement aid: a robot that cannot write them plays on
        }
        lastError = "";
    }

    @Override
    public void onBattleEnded(BattleEndedEvent e) {
        if (client != null) {
            client.close(); // a goodbye: the server keeps the bot loaded and saves it at its own stop
            client = null;
        }
    }
}
