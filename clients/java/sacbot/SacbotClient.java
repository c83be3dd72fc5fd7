package sacbot;

import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.value.Value;

/**
 * A game's connection to {@code sacbot serve} (protocol version 1, docs/protocol.md), over TCP.
 *
 * <pre>{@code
 * SacbotClient.Box obs = new SacbotClient.Box(new int[] {3}, -1.0, 1.0);
 * SacbotClient.Box act = new SacbotClient.Box(new int[] {1}, -2.0, 2.0);
 * try (SacbotClient bot = new SacbotClient("127.0.0.1", 7373, "my-bot", obs, act, null)) {
 *     bot.connect();                                   // retries with backoff while no server listens
 *     for (int episode = 0; episode < 100; episode++) {
 *         bot.newEpisode("tracker");
 *         double[] o = game.reset();
 *         Double reward = null;                        // the first step of an episode has no reward
 *         boolean terminated = false, truncated = false;
 *         double[] action;
 *         while ((action = bot.step(o, reward, terminated, truncated)) != null) {
 *             Game.Result r = game.step(action);
 *             o = r.obs; reward = r.reward; terminated = r.terminated; truncated = r.truncated;
 *         }
 *     }
 * }
 * }</pre>
 *
 * <p>{@link #step} sends what followed the last action and returns the next one, or null when that step
 * ended the episode. A refusal arrives as {@link ServerError} (the server's code and message) and the
 * connection is closed; a lost server as another {@link IOException}: call {@link #connect()} again and
 * start a new episode. One instance serves one game loop (it is not thread-safe).
 */
public final class SacbotClient implements AutoCloseable {
    public static final int PROTOCOL_VERSION = 1;
    public static final int DEFAULT_PORT = 7373;
    public static final int MAX_FRAME = 1 << 20;

    /** A Box space: a shape, and one bound for every value or one per value (row-major). */
    public static final class Box {
        final int[] shape;
        final double[] low;
        final double[] high;

        public Box(int[] shape, double low, double high) {
            this(shape, fill(shape, low), fill(shape, high));
        }

        public Box(int[] shape, double[] low, double[] high) {
            int n = size(shape);
            if (low.length != n || high.length != n) {
                throw new IllegalArgumentException("low and high need " + n + " values each (the shape "
                        + Arrays.toString(shape) + "), got " + low.length + " and " + high.length);
            }
            this.shape = shape.clone();
            this.low = low.clone();
            this.high = high.clone();
        }

        public int size() {
            return size(shape);
        }

        private static int size(int[] shape) {
            int n = 1;
            for (int d : shape) {
                n *= d;
            }
            return n;
        }

        private static double[] fill(int[] shape, double v) {
            double[] a = new double[size(shape)];
            Arrays.fill(a, v);
            return a;
        }
    }

    /** The server refused a message; {@link #code} is stable (docs/protocol.md lists them). */
    public static final class ServerError extends IOException {
        private static final long serialVersionUID = 1L;
        public final String code;
        public final String detail;

        ServerError(String code, String detail) {
            super(code + ": " + detail);
            this.code = code;
            this.detail = detail;
        }
    }

    private final String host;
    private final int port;
    private final String bot;
    private final Box obs;
    private final Box action;
    private final String token;
    private int timeoutMs = 60_000; // a reply (a lockstep server's waits for training)
    private int helloTimeoutMs = 300_000; // the welcome: the server starts the bot and its learner
    private long connectForMs = 30_000; // how long connect() retries a server that is not there
    private Socket socket;
    private DataInputStream in;
    private OutputStream out;
    private Map<String, Value> welcome;
    private Map<String, Value> last;

    /** {@code token}: the server's shared secret, or null when it has none. */
    public SacbotClient(String host, int port, String bot, Box obs, Box action, String token) {
        if (action.shape.length != 1) {
            throw new IllegalArgumentException("the action space must have one dimension");
        }
        this.host = host;
        this.port = port;
        this.bot = bot;
        this.obs = obs;
        this.action = action;
        this.token = token;
    }

    /** Seconds a reply may take, the welcome, and connect()'s retrying. */
    public SacbotClient timeouts(double replyS, double helloS, double connectForS) {
        this.timeoutMs = (int) (replyS * 1000);
        this.helloTimeoutMs = (int) (helloS * 1000);
        this.connectForMs = (long) (connectForS * 1000);
        return this;
    }

    /** Connects (retrying with backoff), says hello, and returns the welcome. */
    public Map<String, Value> connect() throws IOException {
        disconnect();
        long deadline = System.currentTimeMillis() + connectForMs;
        long waitMs = 50;
        while (true) {
            Socket s = new Socket();
            try {
                s.setTcpNoDelay(true); // one small frame a tick: no Nagle delay
                s.connect(new InetSocketAddress(host, port), timeoutMs);
                socket = s;
                break;
            } catch (ConnectException e) {
                s.close();
                if (System.currentTimeMillis() + waitMs > deadline) {
                    throw new ConnectException("no sacbot server at " + host + ":" + port + " after "
                            + connectForMs / 1000.0 + " s: " + e.getMessage());
                }
                sleep(waitMs); // backoff between attempts to reach a server that is (re)starting
                waitMs = Math.min(waitMs * 2, 2000);
            }
        }
        in = new DataInputStream(socket.getInputStream());
        out = new BufferedOutputStream(socket.getOutputStream());
        MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
        pk.packMapHeader(6);
        pk.packString("type").packString("hello");
        pk.packString("version").packInt(PROTOCOL_VERSION);
        pk.packString("bot").packString(bot);
        pk.packString("obs_space");
        packBox(pk, obs);
        pk.packString("action_space");
        packBox(pk, action);
        pk.packString("token");
        if (token == null) {
            pk.packNil();
        } else {
            pk.packString(token);
        }
        welcome = call(pk, "welcome", helloTimeoutMs);
        return welcome;
    }

    /** Starts an episode against {@code opponent} (a stable name); returns the bot's episode index. */
    public long newEpisode(String opponent) throws IOException {
        MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
        pk.packMapHeader(2);
        pk.packString("type").packString("new_episode");
        pk.packString("opponent").packString(opponent == null ? "" : opponent);
        return call(pk, "ok", timeoutMs).get("episode").asIntegerValue().toLong();
    }

    /** {@link #step(double[], Double, boolean, boolean, Boolean)} without an outcome. */
    public double[] step(double[] o, Double reward, boolean terminated, boolean truncated) throws IOException {
        return step(o, reward, terminated, truncated, null);
    }

    /**
     * Sends this tick's observation (row-major) with the reward and flags of the last action (reward null
     * on an episode's first step) and returns the next action, or null when this step ended the episode.
     * {@code won}, when not null at an episode's end, is recorded as its outcome.
     */
    public double[] step(double[] o, Double reward, boolean terminated, boolean truncated, Boolean won)
            throws IOException {
        MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
        pk.packMapHeader(won == null ? 5 : 6);
        pk.packString("type").packString("step");
        pk.packString("obs").packArrayHeader(o.length);
        for (double v : o) {
            pk.packDouble(v);
        }
        pk.packString("reward");
        if (reward == null) {
            pk.packNil();
        } else {
            pk.packDouble(reward);
        }
        pk.packString("terminated").packBoolean(terminated);
        pk.packString("truncated").packBoolean(truncated);
        if (won != null) {
            pk.packString("info").packMapHeader(1).packString("won").packBoolean(won);
        }
        Map<String, Value> reply = call(pk, "action", timeoutMs);
        Value a = reply.get("action");
        if (a == null || a.isNilValue()) {
            return null;
        }
        List<Value> values = a.asArrayValue().list();
        double[] out = new double[values.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = values.get(i).asNumberValue().toDouble();
        }
        return out;
    }

    /** The welcome of the last connect(): version, bot, ticks, episodes, settings. */
    public Map<String, Value> welcome() {
        return welcome;
    }

    /** The bot's tick counter as of the last reply. */
    public long tick() {
        Value t = last == null ? null : last.get("tick");
        return t == null ? (welcome == null ? 0 : welcome.get("ticks").asIntegerValue().toLong())
                : t.asIntegerValue().toLong();
    }

    /** Drops the connection without a close message (what a crashed game does). */
    public void disconnect() {
        if (socket != null) {
            try {
                socket.close();
            } catch (IOException ignored) {
                // closing a broken socket: nothing left to do
            }
            socket = null;
            in = null;
            out = null;
        }
    }

    /** Says goodbye and closes; the bot stays loaded on the server. */
    @Override
    public void close() {
        if (socket == null) {
            return;
        }
        try {
            MessageBufferPacker pk = MessagePack.newDefaultBufferPacker();
            pk.packMapHeader(1).packString("type").packString("close");
            call(pk, "bye", timeoutMs);
        } catch (IOException ignored) {
            // the server is gone or refused: closing is all that is left
        } finally {
            disconnect();
        }
    }

    private static void packBox(MessageBufferPacker pk, Box b) throws IOException {
        pk.packMapHeader(3);
        pk.packString("shape").packArrayHeader(b.shape.length);
        for (int d : b.shape) {
            pk.packInt(d);
        }
        pk.packString("low").packArrayHeader(b.low.length);
        for (double v : b.low) {
            pk.packDouble(v);
        }
        pk.packString("high").packArrayHeader(b.high.length);
        for (double v : b.high) {
            pk.packDouble(v);
        }
    }

    private Map<String, Value> call(MessageBufferPacker pk, String want, int replyTimeoutMs) throws IOException {
        if (socket == null) {
            throw new IOException("not connected: call connect() first");
        }
        byte[] body = pk.toByteArray();
        Map<String, Value> reply;
        try {
            out.write(ByteBuffer.allocate(4).putInt(body.length).array());
            out.write(body);
            out.flush();
            socket.setSoTimeout(replyTimeoutMs);
            int n = in.readInt(); // big-endian, as the protocol's length prefix
            if (n <= 0 || n > MAX_FRAME) {
                throw new IOException("the server sent a frame of " + n + " bytes; expected 1 to " + MAX_FRAME);
            }
            byte[] data = new byte[n];
            in.readFully(data);
            reply = decode(data);
        } catch (SocketTimeoutException | EOFException e) {
            disconnect();
            throw new IOException("lost the server at " + host + ":" + port + ": " + e, e);
        } catch (IOException e) {
            disconnect();
            throw e;
        }
        String type = str(reply.get("type"));
        if ("error".equals(type)) {
            disconnect();
            throw new ServerError(str(reply.get("code")), str(reply.get("message")));
        }
        if (!want.equals(type)) {
            disconnect();
            throw new IOException("the server answered '" + type + "' where '" + want + "' was expected");
        }
        last = reply;
        return reply;
    }

    private static Map<String, Value> decode(byte[] data) throws IOException {
        try (MessageUnpacker up = MessagePack.newDefaultUnpacker(data)) {
            Value v = up.unpackValue();
            if (!v.isMapValue()) {
                throw new IOException("the server sent a " + v.getValueType() + "; expected a map");
            }
            Map<String, Value> m = new HashMap<>();
            for (Map.Entry<Value, Value> e : v.asMapValue().map().entrySet()) {
                if (e.getKey().isStringValue()) {
                    m.put(e.getKey().asStringValue().asString(), e.getValue());
                }
            }
            return m;
        }
    }

    private static String str(Value v) {
        return v == null || v.isNilValue() ? null : (v.isStringValue() ? v.asStringValue().asString() : v.toString());
    }

    private static void sleep(long ms) throws IOException {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted while waiting to reconnect", e);
        }
    }
}
