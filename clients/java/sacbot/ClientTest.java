package sacbot;

import java.util.Map;

import org.msgpack.value.Value;

/**
 * A plain-Java test of {@link SacbotClient} against a running {@code sacbot serve}: hello, two short
 * episodes, a reconnect that continues the bot, and a refused message. Exits 0 and prints
 * "java client test: ok" when every check holds, 1 with the failed check otherwise.
 *
 * <pre>java -cp OUT:/usr/share/java/msgpack-core.jar sacbot.ClientTest --port 7373 --bot java-test [--token T]
 * java -cp OUT:/usr/share/java/msgpack-core.jar sacbot.ClientTest --socket /tmp/sacbot.sock --bot java-test</pre>
 */
public final class ClientTest {
    private ClientTest() {
    }

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    public static void main(String[] args) {
        String host = "127.0.0.1";
        int port = SacbotClient.DEFAULT_PORT;
        String bot = "java-test";
        String token = null;
        String socketPath = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--host": host = args[i + 1]; break;
                case "--port": port = Integer.parseInt(args[i + 1]); break;
                case "--bot": bot = args[i + 1]; break;
                case "--token": token = args[i + 1]; break;
                case "--socket": socketPath = args[i + 1]; break;
                default: System.err.println("unknown argument " + args[i]); System.exit(2);
            }
        }
        try {
            run(host, port, socketPath, bot, token);
        } catch (Throwable e) {
            System.out.println("java client test: FAILED: " + e);
            e.printStackTrace(System.out);
            System.exit(1);
        }
        System.out.println("java client test: ok");
    }

    private static SacbotClient client(String host, int port, String socketPath, String bot, SacbotClient.Box obs,
                                       SacbotClient.Box act, String token) {
        return socketPath != null ? SacbotClient.unix(socketPath, bot, obs, act, token)
                : new SacbotClient(host, port, bot, obs, act, token);
    }

    private static void run(String host, int port, String socketPath, String bot, String token) throws Exception {
        SacbotClient.Box obs = new SacbotClient.Box(new int[] {3}, -1.0, 1.0);
        SacbotClient.Box act = new SacbotClient.Box(new int[] {1}, new double[] {-2.0}, new double[] {2.0});
        long ticks0;
        try (SacbotClient c = client(host, port, socketPath, bot, obs, act, token)) {
            Map<String, Value> w = c.connect();
            check(w.get("version").asIntegerValue().toInt() == 1, "welcome.version is 1: " + w);
            check(bot.equals(w.get("bot").asStringValue().asString()), "welcome.bot is " + bot + ": " + w);
            ticks0 = w.get("ticks").asIntegerValue().toLong();
            long[] lengths = {20, 5};
            for (int ep = 0; ep < lengths.length; ep++) {
                long index = c.newEpisode("java");
                check(index >= ep, "episode index " + index + " >= " + ep);
                double[] o = {0.0, 0.0, 0.0};
                Double reward = null;
                boolean truncated = false;
                double[] a;
                int t = 0;
                while ((a = c.step(o, reward, false, truncated, truncated ? Boolean.TRUE : null)) != null) {
                    check(a.length == 1, "an action of 1 value, got " + a.length);
                    check(Double.isFinite(a[0]) && a[0] >= -2.0 && a[0] <= 2.0, "action in [-2, 2], got " + a[0]);
                    t++;
                    o = new double[] {t / 30.0, -t / 30.0, 0.5};
                    reward = -Math.abs(a[0] - 1.0);
                    truncated = t == lengths[ep];
                }
                check(t == lengths[ep], "episode " + ep + " took " + lengths[ep] + " actions, got " + t);
            }
            check(c.tick() == ticks0 + 25, "tick went from " + ticks0 + " to " + (ticks0 + 25) + ", got " + c.tick());
        }
        // The same bot again: its tick counter goes on; a wrong observation is refused with bad_message.
        SacbotClient c = client(host, port, socketPath, bot, obs, act, token);
        Map<String, Value> w = c.connect();
        check(w.get("ticks").asIntegerValue().toLong() == ticks0 + 25, "a reconnect continues the bot: " + w);
        c.newEpisode("java");
        try {
            c.step(new double[] {1.0, 2.0}, null, false, false);
            check(false, "an observation of 2 values was refused");
        } catch (SacbotClient.ServerError e) {
            check("bad_message".equals(e.code), "code bad_message, got " + e.code);
            check(e.detail.contains("expected 3"), "the message says 3 values are expected: " + e.detail);
        }
        c.close();
    }
}
