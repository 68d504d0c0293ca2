//! Prometheus text exposition of the server's counters: requests by route and status, latency
//! histograms per route, queue depth, tokens processed. Hand-written (a few atomics and one
//! mutex) rather than a metrics framework: the set is small and fixed.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
}

/// Gauges and counters read from elsewhere at scrape time.
pub struct Snapshot {
    pub queued: usize,
    pub running: usize,
    pub workers_ready: usize,
    pub workers: usize,
    pub tokens: u64,
    pub abandoned: u64,
    pub cancelled: u64,
    pub packed: u64,
    pub panics: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub cache_bytes: u64,
    /// Per worker, where the device backend reports it.
    pub device: Vec<clef_device::DeviceUsage>,
    /// Per worker, where the device backend runs whole passes (ttnn: traced).
    pub passes: Vec<clef_device::PassStats>,
}

impl Metrics {
    pub fn record(&self, route: &'static str, status: u16, seconds: f64) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((route, status)).or_insert(0) += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let h = l.entry(route).or_default();
            for (i, b) in BUCKETS.iter().enumerate() {
                if seconds <= *b {
                    h.counts[i] += 1;
                }
            }
            h.count += 1;
            h.sum += seconds;
        }
    }

    pub fn render(&self, s: &Snapshot) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP clef_requests_total HTTP requests by route and status."
        );
        let _ = writeln!(out, "# TYPE clef_requests_total counter");
        if let Ok(r) = self.requests.lock() {
            for ((route, status), n) in r.iter() {
                let _ = writeln!(
                    out,
                    "clef_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP clef_request_duration_seconds Wall time of HTTP requests."
        );
        let _ = writeln!(out, "# TYPE clef_request_duration_seconds histogram");
        if let Ok(l) = self.latency.lock() {
            for (route, h) in l.iter() {
                for (b, c) in BUCKETS.iter().zip(h.counts) {
                    let _ = writeln!(
                        out,
                        "clef_request_duration_seconds_bucket{{route=\"{route}\",le=\"{b}\"}} {c}"
                    );
                }
                let _ = writeln!(
                    out,
                    "clef_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "clef_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "clef_request_duration_seconds_count{{route=\"{route}\"}} {}",
                    h.count
                );
            }
        }
        let gauges = [
            (
                "clef_queue_depth",
                "Requests waiting for a worker.",
                "gauge",
                s.queued as f64,
            ),
            (
                "clef_requests_running",
                "Requests a worker is running.",
                "gauge",
                s.running as f64,
            ),
            (
                "clef_workers_ready",
                "Workers that finished warm-up.",
                "gauge",
                s.workers_ready as f64,
            ),
            (
                "clef_workers",
                "Workers configured.",
                "gauge",
                s.workers as f64,
            ),
            (
                "clef_tokens_total",
                "Prompt tokens run through the model.",
                "counter",
                s.tokens as f64,
            ),
            (
                "clef_abandoned_total",
                "Queued requests dropped because the client left.",
                "counter",
                s.abandoned as f64,
            ),
            (
                "clef_cancelled_total",
                "Running requests stopped between prefill chunks because the client left.",
                "counter",
                s.cancelled as f64,
            ),
            (
                "clef_packed_requests_total",
                "Requests answered from a prefill pass shared with other requests (packed).",
                "counter",
                s.packed as f64,
            ),
            (
                "clef_worker_panics_total",
                "Requests that panicked inside a worker (each one replaced its worker).",
                "counter",
                s.panics as f64,
            ),
            (
                "clef_prefix_cache_hits_total",
                "Requests whose state prefix was cached.",
                "counter",
                s.cache_hits as f64,
            ),
            (
                "clef_prefix_cache_misses_total",
                "Cacheable requests whose state prefix was not cached.",
                "counter",
                s.cache_misses as f64,
            ),
            (
                "clef_prefix_cache_evictions_total",
                "Prefix cache slots dropped to make room.",
                "counter",
                s.cache_evictions as f64,
            ),
            (
                "clef_prefix_cache_bytes",
                "Bytes held by the prefix cache slots of all workers.",
                "gauge",
                s.cache_bytes as f64,
            ),
        ];
        for (name, help, kind, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        if !s.device.is_empty() {
            let _ = writeln!(
                out,
                "# HELP clef_device_bytes Device memory held by a worker's mesh, per device.\n# TYPE clef_device_bytes gauge"
            );
            for (w, u) in s.device.iter().enumerate() {
                for (id, b) in u.device_ids.iter().zip(&u.bytes_per_device) {
                    let _ = writeln!(
                        out,
                        "clef_device_bytes{{worker=\"{w}\",device=\"{id}\"}} {b}"
                    );
                }
            }
            let _ = writeln!(
                out,
                "# HELP clef_device_live_tensors Tensors alive on a worker's mesh.\n# TYPE clef_device_live_tensors gauge"
            );
            for (w, u) in s.device.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "clef_device_live_tensors{{worker=\"{w}\"}} {}",
                    u.live_tensors
                );
            }
        }
        render_passes(&mut out, &s.passes);
        out
    }
}

/// The whole prefill passes per worker: replayed from a trace, or eager (op by op) and why,
/// and the traces' memory.
fn render_passes(out: &mut String, passes: &[clef_device::PassStats]) {
    if passes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP clef_prefill_chunks_total Prefill chunks on a Tenstorrent mesh: replayed from a trace (path=traced), or dispatched op by op (path=eager; reason warming: the first of its shape, untraceable, layer by layer: a pass the shim does not take).\n# TYPE clef_prefill_chunks_total counter"
    );
    for (w, p) in passes.iter().enumerate() {
        let _ = writeln!(
            out,
            "clef_prefill_chunks_total{{worker=\"{w}\",path=\"traced\",reason=\"\"}} {}",
            p.traced
        );
        for (reason, n) in &p.eager {
            let _ = writeln!(
                out,
                "clef_prefill_chunks_total{{worker=\"{w}\",path=\"eager\",reason=\"{reason}\"}} {n}"
            );
        }
    }
    type Gauge = (
        &'static str,
        &'static str,
        fn(&clef_device::PassStats) -> u64,
    );
    let gauges: [Gauge; 4] = [
        (
            "clef_prefill_forms",
            "Forms of prefill pass a worker's mesh has seen (each runs eagerly once, then from its trace).",
            |p| p.forms,
        ),
        (
            "clef_traces",
            "Prefill traces a worker's mesh holds.",
            |p| p.traces,
        ),
        (
            "clef_trace_region_bytes",
            "Trace region bytes in use per device (the allocator's count).",
            |p| p.trace_region_bytes,
        ),
        (
            "clef_trace_reserved_bytes",
            "DRAM per device kept for the traces' intermediates.",
            |p| p.reserved_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (w, p) in passes.iter().enumerate() {
            let _ = writeln!(out, "{name}{{worker=\"{w}\"}} {}", value(p));
        }
    }
}
