package sacbot;

import java.io.IOException;

/**
 * An example game loop: a point on a line learns to reach a target that moves every episode.
 * Run {@code sacbot serve} first, then
 * <pre>java -cp OUT:/usr/share/java/msgpack-core.jar sacbot.ExampleGame [--port 7373] [--episodes 200]</pre>
 * The observation is (position, target, target - position), the action a velocity in [-1, 1], the
 * reward minus the distance. A lost server is reconnected to (with backoff) and the episode started again.
 */
public final class ExampleGame {
    private ExampleGame() {
    }

    public static void main(String[] args) throws IOException {
        int port = SacbotClient.DEFAULT_PORT;
        int episodes = 200;
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (args[i].equals("--port")) {
                port = Integer.parseInt(args[i + 1]);
            } else if (args[i].equals("--episodes")) {
                episodes = Integer.parseInt(args[i + 1]);
            }
        }
        SacbotClient.Box obs = new SacbotClient.Box(new int[] {3}, -2.0, 2.0);
        SacbotClient.Box act = new SacbotClient.Box(new int[] {1}, -1.0, 1.0);
        java.util.Random rng = new java.util.Random(0);
        try (SacbotClient bot = new SacbotClient("127.0.0.1", port, "java-example", obs, act, null)) {
            bot.connect();
            for (int episode = 0; episode < episodes; episode++) {
                double target = rng.nextDouble() * 2 - 1;
                double x = 0.0;
                double total = 0.0;
                try {
                    bot.newEpisode("moving-target");
                    Double reward = null; // no reward before the first action
                    boolean truncated = false;
                    double[] a;
                    int t = 0;
                    while ((a = bot.step(new double[] {x, target, target - x}, reward, false, truncated)) != null) {
                        x = Math.max(-1.0, Math.min(1.0, x + 0.1 * a[0]));
                        reward = -Math.abs(target - x);
                        total += reward;
                        truncated = ++t == 100;
                    }
                } catch (SacbotClient.ServerError e) {
                    throw e; // a refusal names what is wrong: mending it is the game's job
                } catch (IOException e) {
                    System.out.println("lost the server (" + e.getMessage() + "); reconnecting");
                    bot.connect();
                    continue;
                }
                System.out.printf("episode %d: return %.2f%n", episode, total);
            }
        }
    }
}
