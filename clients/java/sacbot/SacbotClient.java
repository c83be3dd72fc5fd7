package sacbot;

import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ConnectException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketException;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.MessageUnpacker;
import org.msgpack.value.Value;

/**
 * A game's connection to {@code sacbot serve} (protocol version 1, docs/protocol.md), over TCP or, with
 * {@link #unix}, a Unix socket ({@code sacbot serve --socket PATH}; Java 16 or newer).
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
 * start a new episode. A call cut off before its reply was read (an Error thrown into the calling thread)
 * makes the next call drop the connection with an {@link IOException} too, so no late reply is taken for
 * another call's. One instance serves one game loop (it is not thread-safe).
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
    private final String socketPath; // null: TCP to host:port
    private Socket socket;
    private UnixChannel unixChannel;
    private DataInputStream in;
    private OutputStream out;
    private Map<String, Value> welcome;
    private Map<String, Value> last;
    // A request is written and its reply not yet read whole. Still set at the next call means that call was
    // cut off by something other than an IOException (an Error thrown into its thread: Robocode stops a
    // robot's thread that way), and the stream may hold half a reply: the connection cannot be trusted.
    private boolean midCall;
    private final MessageBufferPacker packer = MessagePack.newDefaultBufferPacker();
    private byte[] inbuf = new byte[4096]; // a reply's bytes, kept between calls, as the packer is

    /** {@code token}: the server's shared secret, or null when it has none. */
    public SacbotClient(String host, int port, String bot, Box obs, Box action, String token) {
        this(host, port, null, bot, obs, action, token);
    }

    /** A client of the server listening on the Unix socket at {@code path} ({@code --socket PATH}). */
    public static SacbotClient unix(String path, String bot, Box obs, Box action, String token) {
        return new SacbotClient(null, -1, path, bot, obs, action, token);
    }

    private SacbotClient(String host, int port, String socketPath, String bot, Box obs, Box action, String token) {
        if (action.shape.length != 1) {
            throw new IllegalArgumentException("the action space must have one dimension");
        }
        this.host = host;
        this.port = port;
        this.socketPath = socketPath;
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
            try {
                if (socketPath != null) {
                    unixChannel = new UnixChannel(socketPath);
                    in = new DataInputStream(unixChannel.input);
                    out = new BufferedOutputStream(unixChannel.output);
                    break;
                }
                Socket s = new Socket();
                try {
                    s.setTcpNoDelay(true); // one small frame a tick: no Nagle delay
                    s.connect(new InetSocketAddress(host, port), timeoutMs);
                } catch (IOException e) {
                    s.close();
                    throw e;
                }
                socket = s;
                in = new DataInputStream(socket.getInputStream());
                out = new BufferedOutputStream(socket.getOutputStream());
                break;
            } catch (SocketException e) { // no listener yet: a refused TCP connect, or no Unix socket file
                if (socketPath == null && !(e instanceof ConnectException)) {
                    throw e;
                }
                if (System.currentTimeMillis() + waitMs > deadline) {
                    throw new ConnectException("no sacbot server at " + where() + " after "
                            + connectForMs / 1000.0 + " s: " + e.getMessage());
                }
                sleep(waitMs); // backoff between attempts to reach a server that is (re)starting
                waitMs = Math.min(waitMs * 2, 2000);
            }
        }
        MessageBufferPacker pk = packer();
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
        MessageBufferPacker pk = packer();
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
        MessageBufferPacker pk = packer();
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
        try {
            if (socket != null) {
                socket.close();
            }
            if (unixChannel != null) {
                unixChannel.close();
            }
        } catch (IOException ignored) {
            // closing a broken socket: nothing left to do
        }
        socket = null;
        unixChannel = null;
        in = null;
        out = null;
        midCall = false;
    }

    private String where() {
        return socketPath != null ? "unix " + socketPath : host + ":" + port;
    }

    /**
     * A Unix socket channel as the two streams the protocol code uses. Its reads wait at most the
     * reply timeout (a TCP socket has SO_TIMEOUT; a channel has none, so a selector waits instead),
     * and its writes finish whole.
     */
    private static final class UnixChannel {
        final SocketChannel channel;
        final Selector selector;
        int readTimeoutMs = 60_000;
        final InputStream input = new InputStream() {
            @Override
            public int read() throws IOException {
                byte[] one = new byte[1];
                return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
            }

            @Override
            public int read(byte[] b, int off, int len) throws IOException {
                if (len == 0) {
                    return 0;
                }
                ByteBuffer buf = ByteBuffer.wrap(b, off, len);
                while (true) {
                    int n = channel.read(buf);
                    if (n != 0) {
                        return n;
                    }
                    if (selector.select(Math.max(1, readTimeoutMs)) == 0) {
                        throw new SocketTimeoutException("no reply within " + readTimeoutMs + " ms");
                    }
                    selector.selectedKeys().clear();
                }
            }
        };
        final OutputStream output = new OutputStream() {
            @Override
            public void write(int b) throws IOException {
                write(new byte[] {(byte) b}, 0, 1);
            }

            @Override
            public void write(byte[] b, int off, int len) throws IOException {
                ByteBuffer buf = ByteBuffer.wrap(b, off, len);
                while (buf.hasRemaining()) {
                    if (channel.write(buf) == 0) { // the server reads slowly: wait until it can take more
                        try (Selector w = Selector.open()) {
                            channel.register(w, SelectionKey.OP_WRITE);
                            w.select(1000);
                        }
                    }
                }
            }
        };

        UnixChannel(String path) throws IOException {
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            try {
                channel.connect(UnixDomainSocketAddress.of(path));
                channel.configureBlocking(false);
                selector = Selector.open();
                channel.register(selector, SelectionKey.OP_READ);
            } catch (IOException e) {
                channel.close();
                throw e;
            }
        }

        void close() throws IOException {
            try {
                selector.close();
            } finally {
                channel.close();
            }
        }
    }

    /** Says goodbye and closes; the bot stays loaded on the server. */
    @Override
    public void close() {
        if (socket == null && unixChannel == null) {
            return;
        }
        try {
            MessageBufferPacker pk = packer();
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

    /**
     * The one packer, emptied: a new one allocates an 8 KB buffer, which at thousands of steps a second is
     * most of the client's garbage (the JVM collected 4 times per 100k steps with reuse, 7 without; the round
     * trip's latency was the same).
     */
    private MessageBufferPacker packer() {
        packer.clear();
        return packer;
    }

    private Map<String, Value> call(MessageBufferPacker pk, String want, int replyTimeoutMs) throws IOException {
        if (socket == null && unixChannel == null) {
            throw new IOException("not connected: call connect() first");
        }
        if (midCall) {
            disconnect();
            throw new IOException("the last call to " + where() + " was cut off before its reply was read; the "
                    + "connection is dropped: connect again");
        }
        byte[] body = pk.toByteArray();
        Map<String, Value> reply;
        midCall = true;
        try {
            out.write(body.length >>> 24);
            out.write(body.length >>> 16);
            out.write(body.length >>> 8);
            out.write(body.length);
            out.write(body);
            out.flush();
            if (socket != null) {
                socket.setSoTimeout(replyTimeoutMs);
            } else {
                unixChannel.readTimeoutMs = replyTimeoutMs;
            }
            int n = in.readInt(); // big-endian, as the protocol's length prefix
            if (n <= 0 || n > MAX_FRAME) {
                throw new IOException("the server sent a frame of " + n + " bytes; expected 1 to " + MAX_FRAME);
            }
            if (inbuf.length < n) {
                inbuf = new byte[Math.max(n, 2 * inbuf.length)];
            }
            in.readFully(inbuf, 0, n);
            midCall = false;
            reply = decode(inbuf, n);
        } catch (SocketTimeoutException | EOFException e) {
            disconnect();
            throw new IOException("lost the server at " + where() + ": " + e, e);
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

    private static Map<String, Value> decode(byte[] data, int n) throws IOException {
        try (MessageUnpacker up = MessagePack.newDefaultUnpacker(data, 0, n)) {
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
