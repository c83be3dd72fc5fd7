package sacbot;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.value.Value;

/**
 * A plain-Java test of {@link SacbotClient} against a running {@code sacbot serve}: hello, two short
 * episodes, a reconnect that continues the bot, and a refused message; then, against a stand-in server of
 * its own, that a call cut off before its reply was read (Robocode stops a robot's thread that way) leaves
 * no stale reply to be taken for the next call's. Exits 0 and prints
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
            cutOff();
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

    private static byte[] frame(String... kv) throws IOException {
        MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
        pk.packMapHeader(kv.length / 2);
        for (int i = 0; i + 1 < kv.length; i += 2) {
            pk.packString(kv[i]);
            if ("episode".equals(kv[i])) {
                pk.packInt(Integer.parseInt(kv[i + 1]));
            } else {
                pk.packString(kv[i + 1]);
            }
        }
        byte[] body = pk.toByteArray();
        byte[] f = new byte[4 + body.length];
        f[0] = (byte) (body.length >>> 24);
        f[1] = (byte) (body.length >>> 16);
        f[2] = (byte) (body.length >>> 8);
        f[3] = (byte) body.length;
        System.arraycopy(body, 0, f, 4, body.length);
        return f;
    }

    private static void readFrame(DataInputStream in) throws IOException {
        in.readFully(new byte[in.readInt()]);
    }

    /**
     * A new_episode whose thread is stopped while it waits for the reply; the stand-in server answers it just
     * after. The next call must not take that stale answer for its own: it drops the connection and says so.
     */
    @SuppressWarnings({"deprecation", "removal"})
    private static void cutOff() throws Exception {
        CountDownLatch asked = new CountDownLatch(1);
        CountDownLatch stopped = new CountDownLatch(1);
        try (ServerSocket ss = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            Thread server = new Thread(() -> {
                try (Socket s = ss.accept()) {
                    DataInputStream in = new DataInputStream(s.getInputStream());
                    OutputStream out = s.getOutputStream();
                    readFrame(in); // hello
                    out.write(frame("type", "welcome"));
                    out.flush();
                    readFrame(in); // new_episode
                    asked.countDown();
                    stopped.await(10, TimeUnit.SECONDS);
                    out.write(frame("type", "ok", "episode", "7")); // the answer, late
                    out.flush();
                    readFrame(in); // a second call on this connection, if the client makes one
                    out.write(frame("type", "ok", "episode", "8"));
                    out.flush();
                } catch (IOException | InterruptedException ignored) {
                    // the client dropped the connection: what the test expects
                }
            }, "stand-in-server");
            server.setDaemon(true);
            server.start();
            SacbotClient.Box box = new SacbotClient.Box(new int[] {1}, -1.0, 1.0);
            SacbotClient c = new SacbotClient("127.0.0.1", ss.getLocalPort(), "cut", box, box, null)
                    .timeouts(10.0, 10.0, 0.0);
            c.connect();
            Thread caller = new Thread(() -> {
                try {
                    c.newEpisode("x");
                } catch (IOException ignored) {
                    // not expected: the thread is stopped first
                }
            }, "caller");
            caller.start();
            check(asked.await(10, TimeUnit.SECONDS), "the stand-in server got the new_episode");
            try {
                caller.stop(); // what Robocode does to a robot's thread
            } catch (UnsupportedOperationException e) {
                System.out.println("java client test: this JVM cannot stop a thread; the cut-off check is skipped");
                stopped.countDown();
                c.disconnect();
                return;
            }
            stopped.countDown();
            caller.join(10_000);
            check(!caller.isAlive(), "the stopped caller ended");
            try {
                long episode = c.newEpisode("y");
                check(false, "a call after a cut-off one refused, got episode " + episode);
            } catch (IOException e) {
                check(e.getMessage().contains("cut off"), "the refusal says the last call was cut off: " + e);
            }
        }
    }
}
