package sacbot;

import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.Arrays;
import java.util.Random;

/**
 * Times {@code step} round trips against a running {@code sacbot serve} (tools/bench/serve.py runs it):
 * one episode of {@code --warmup} then {@code --ticks} timed steps, back to back. Prints one JSON line, with the
 * JVM's garbage collections during the timed steps (a collection's pause lands in some step's round trip).
 *
 * <pre>java -cp OUT:/usr/share/java/msgpack-core.jar sacbot.Bench --port 7373 --ticks 100000 [--socket PATH]</pre>
 */
public final class Bench {
    private Bench() {
    }

    public static void main(String[] args) throws Exception {
        String socketPath = null;
        int port = SacbotClient.DEFAULT_PORT;
        int ticks = 100_000;
        int warmup = 1500;
        int obsDim = 35;
        int actDim = 2;
        String bot = "bench-java";
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--port": port = Integer.parseInt(args[i + 1]); break;
                case "--socket": socketPath = args[i + 1]; break;
                case "--ticks": ticks = Integer.parseInt(args[i + 1]); break;
                case "--warmup": warmup = Integer.parseInt(args[i + 1]); break;
                case "--obs-dim": obsDim = Integer.parseInt(args[i + 1]); break;
                case "--act-dim": actDim = Integer.parseInt(args[i + 1]); break;
                case "--bot": bot = args[i + 1]; break;
                default: System.err.println("unknown argument " + args[i]); System.exit(2);
            }
        }
        SacbotClient.Box obs = new SacbotClient.Box(new int[] {obsDim}, -1.0, 1.0);
        SacbotClient.Box act = new SacbotClient.Box(new int[] {actDim}, -1.0, 1.0);
        SacbotClient c = socketPath != null ? SacbotClient.unix(socketPath, bot, obs, act, null)
                : new SacbotClient("127.0.0.1", port, bot, obs, act, null);
        Random rng = new Random(0);
        long[] times = new long[ticks];
        try (c) {
            c.connect();
            c.newEpisode("bench");
            double[] o = new double[obsDim];
            Double reward = null;
            long start = 0;
            long[] gc0 = gc();
            for (int k = 0; k < warmup + ticks; k++) {
                if (k == warmup) {
                    start = System.nanoTime();
                    gc0 = gc();
                }
                long t0 = System.nanoTime();
                double[] a = c.step(o, reward, false, false);
                long dt = System.nanoTime() - t0;
                if (k >= warmup) {
                    times[k - warmup] = dt;
                }
                for (int j = 0; j < obsDim; j++) {
                    o[j] = rng.nextDouble() * 2 - 1;
                }
                reward = -Math.abs(a[0]);
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            long[] gc1 = gc();
            c.step(o, reward, false, true);
            Arrays.sort(times);
            System.out.printf("{\"p50_us\": %.1f, \"p99_us\": %.1f, \"p999_us\": %.1f, \"max_us\": %.1f, \"n\": %d, "
                    + "\"steps_per_s\": %.1f, \"gc_count\": %d, \"gc_ms\": %d}%n", pct(times, 0.50), pct(times, 0.99),
                    pct(times, 0.999), times[ticks - 1] / 1e3, ticks, ticks / seconds, gc1[0] - gc0[0], gc1[1] - gc0[1]);
        }
    }

    /** Collections so far and their total time (ms), over every collector of this JVM. */
    private static long[] gc() {
        long n = 0;
        long ms = 0;
        for (GarbageCollectorMXBean b : ManagementFactory.getGarbageCollectorMXBeans()) {
            n += Math.max(0, b.getCollectionCount());
            ms += Math.max(0, b.getCollectionTime());
        }
        return new long[] {n, ms};
    }

    private static double pct(long[] sorted, double q) {
        return sorted[(int) Math.min(sorted.length - 1, Math.floor(q * (sorted.length - 1)))] / 1e3;
    }
}
