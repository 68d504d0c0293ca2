//! `clef-tt bench http`: the serving table the Tenstorrent package publishes, measured against
//! a running server over HTTP.
//!
//! Latency: model time (the reply's `latency_ms`) and client wall clock, medians, for a new and
//! a repeated state — 6 questions on a short state, 5 questions on a state of about
//! `--long-tokens` tokens and (optionally) a state piece at the server's limit (sent with
//! `"truncate": true`, so the server cuts it to exactly its limit). A new state differs from
//! every other from its first words on, so it is a prefix cache miss; a repeated one is sent
//! once before the warm-ups. Throughput: requests per second at each client count over
//! `--requests` requests cycling through `--states` distinct states, sent twice, the second
//! pass timed. Everything is bounded by counts and by `--max-seconds`.

use super::median;
use crate::api::client::{Client, Reply};
use serde::Serialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What to measure.
#[derive(clap::Args)]
pub struct HttpBenchOptions {
    /// Measured requests per latency case (medians are reported; the package's protocol: 20).
    #[arg(long, default_value_t = 6)]
    pub samples: usize,
    /// Unmeasured requests before each latency case (the package's: 2).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// State tokens of the long-state case.
    #[arg(long, default_value_t = 2200)]
    pub long_tokens: usize,
    /// Samples of the case at the server's state limit (0 skips it; the package's protocol is
    /// 3 after 1 warm-up).
    #[arg(long, default_value_t = 0)]
    pub limit_samples: usize,
    #[arg(long, default_value_t = 1)]
    pub limit_warmup: usize,
    /// Concurrent clients of the throughput runs (empty skips them).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    pub clients: Vec<usize>,
    /// Requests per throughput pass (the package's protocol: 256).
    #[arg(long, default_value_t = 12)]
    pub requests: usize,
    /// Distinct states the throughput requests cycle through (the package's: 64).
    #[arg(long, default_value_t = 6)]
    pub states: usize,
    /// Stop taking new samples after this many seconds.
    #[arg(long, default_value_t = 900.0)]
    pub max_seconds: f64,
    /// Throughput on short states instead: every request a state of its own of about this
    /// many input tokens, with three questions (0: the `--states` cycle of 6-question bodies).
    #[arg(long, default_value_t = 0)]
    pub short_tokens: usize,
    /// Measure throughput only (no latency cases).
    #[arg(long)]
    pub skip_latency: bool,
    /// A second server (the same model, another setting, e.g. packing off) measured in the
    /// same run: each client count runs against `--url`, then against this one.
    #[arg(long)]
    pub compare: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Medians {
    /// Samples taken (fewer than asked when the time budget ran out).
    pub n: usize,
    pub model_ms: f64,
    pub wall_ms: f64,
    /// `x-clef-prefix-cache` of the samples, e.g. `{"hit": 20}`.
    pub cache: std::collections::BTreeMap<String, usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    pub case: String,
    pub questions: usize,
    pub input_tokens: u64,
    pub new_state: Medians,
    pub repeated_state: Medians,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputRow {
    /// Which server: its URL and packing budget (`pack_tokens`, 0 = off).
    pub server: String,
    pub clients: usize,
    pub requests: usize,
    pub ok: usize,
    pub refused: usize,
    pub failed: usize,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct HttpBenchReport {
    pub url: String,
    pub model: Value,
    pub latency: Vec<LatencyRow>,
    pub throughput: Vec<ThroughputRow>,
}

const WORDS: [&str; 48] = [
    "the",
    "customer",
    "reports",
    "that",
    "checkout",
    "fails",
    "with",
    "an",
    "error",
    "after",
    "payment",
    "and",
    "orders",
    "are",
    "blocked",
    "for",
    "several",
    "hours",
    "since",
    "the",
    "last",
    "deploy",
    "team",
    "says",
    "invoice",
    "totals",
    "look",
    "wrong",
    "while",
    "login",
    "works",
    "but",
    "refunds",
    "stay",
    "pending",
    "on",
    "every",
    "account",
    "we",
    "checked",
    "today",
    "support",
    "asked",
    "engineering",
    "to",
    "look",
    "again",
    "please",
];

/// `n` words, different for every `seed` from the first word on.
fn state_text(n: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = format!("Case {seed}:");
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(' ');
        out.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
    }
    out
}

fn six_questions() -> Value {
    json!({
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "Payments and invoices", "technical": "Bugs and outages",
                              "account": "Logins and access"}},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["Can wait", "This week", "Today", "Now"]},
        "outage": {"type": "noul", "instructions": "Is a service down?"},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
        "sentiment": {"type": "choice", "instructions": "How does the customer sound?",
                      "criteria": {"calm": "Calm", "annoyed": "Annoyed", "angry": "Angry",
                                   "desperate": "Desperate", "neutral": "Neutral"}},
        "escalate": {"type": "score", "instructions": "Should a manager see it?",
                     "criteria": ["No", "Maybe", "Yes"]}
    })
}

fn three_questions() -> Value {
    let mut q = six_questions();
    if let Some(m) = q.as_object_mut() {
        m.retain(|k, _| ["team", "urgency", "outage"].contains(&k.as_str()));
    }
    q
}

fn five_questions() -> Value {
    let mut q = six_questions();
    if let Some(m) = q.as_object_mut() {
        m.shift_remove("escalate");
    }
    q
}

fn body(state: &str, questions: &Value, truncate: bool) -> Vec<u8> {
    let mut b = json!({"model": "clef", "state": state, "questions": questions});
    if truncate {
        b["truncate"] = Value::Bool(true);
    }
    b.to_string().into_bytes()
}

/// Send one body; anything but 200 is an error here.
fn send(client: &Client, body: &[u8]) -> super::Result<(Reply, Value)> {
    let reply = client.decide(body)?;
    if reply.status != 200 {
        refuse!("the server answered {}: {}", reply.status, reply.body);
    }
    let v: Value = serde_json::from_str(&reply.body)
        .map_err(|e| super::BenchError::Refused(format!("the reply is not JSON: {e}")))?;
    Ok((reply, v))
}

fn input_tokens(v: &Value) -> u64 {
    v["usage"]["input_tokens"].as_u64().unwrap_or(0)
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

struct Budget {
    start: Instant,
    seconds: f64,
}

impl Budget {
    fn left(&self) -> bool {
        self.start.elapsed().as_secs_f64() < self.seconds
    }
}

/// `warmup` unmeasured requests, then up to `samples` measured ones, each body from `make(i)`.
fn measure(
    client: &Client,
    budget: &Budget,
    warmup: usize,
    samples: usize,
    make: &dyn Fn(usize) -> Vec<u8>,
) -> super::Result<(Medians, u64)> {
    for i in 0..warmup {
        send(client, &make(i))?;
    }
    let (mut model, mut wall, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
    let mut cache = std::collections::BTreeMap::new();
    for i in 0..samples {
        if i > 0 && !budget.left() {
            tracing::warn!("time budget spent: {i} of {samples} samples");
            break;
        }
        let (reply, v) = send(client, &make(warmup + i))?;
        model.push(v["latency_ms"].as_f64().unwrap_or(f64::NAN));
        wall.push(reply.wall_ms);
        tokens.push(input_tokens(&v) as f64);
        *cache
            .entry(reply.cache.unwrap_or_else(|| "none".into()))
            .or_insert(0) += 1;
    }
    Ok((
        Medians {
            n: model.len(),
            model_ms: median(model),
            wall_ms: median(wall),
            cache,
        },
        median(tokens) as u64,
    ))
}

/// New-state and repeated-state medians of one case; `state(seed)` builds its state.
#[allow(clippy::too_many_arguments)]
fn latency_case(
    client: &Client,
    budget: &Budget,
    case: &str,
    questions: &Value,
    truncate: bool,
    warmup: usize,
    samples: usize,
    state: &dyn Fn(u64) -> String,
) -> super::Result<LatencyRow> {
    eprintln!("{case}: new states");
    // Seeds from 1000 on never repeat a state of another case.
    let seed0 = 1000 + 100_000 * (case.len() as u64);
    let new = |i: usize| body(&state(seed0 + i as u64), questions, truncate);
    let (new_state, tokens) = measure(client, budget, warmup, samples, &new)?;
    eprintln!("{case}: repeated state");
    let same = body(&state(7), questions, truncate);
    send(client, &same)?; // the first sight of the state fills the cache
    let (repeated_state, _) = measure(client, budget, warmup, samples, &|_| same.clone())?;
    Ok(LatencyRow {
        case: case.to_string(),
        questions: questions.as_object().map_or(0, |m| m.len()),
        input_tokens: tokens,
        new_state,
        repeated_state,
    })
}

/// Words that make a request of about `target` input tokens with `questions`, from two probes
/// of the server's token count.
fn words_for_input(client: &Client, target: usize, questions: &Value) -> super::Result<usize> {
    let count = |words: usize| -> super::Result<f64> {
        let (_, v) = send(client, &body(&state_text(words, 2), questions, false))?;
        Ok(input_tokens(&v) as f64)
    };
    let (a, b) = (count(50)?, count(300)?);
    let per_word = ((b - a) / 250.0).max(0.1);
    Ok((50.0 + (target as f64 - a) / per_word).max(1.0) as usize)
}

/// Words that make a state of about `target` state tokens (tokens the state adds to a prompt),
/// from two probes of the server's token count.
fn words_for_tokens(client: &Client, target: usize, questions: &Value) -> super::Result<usize> {
    let count = |words: usize| -> super::Result<f64> {
        let (_, v) = send(client, &body(&state_text(words, 1), questions, false))?;
        Ok(input_tokens(&v) as f64)
    };
    let (a, b) = (count(100)?, count(600)?);
    let per_word = ((b - a) / 500.0).max(0.1);
    Ok((100.0 + (target as f64 - (a - count(0)?)) / per_word).max(1.0) as usize)
}

/// Requests per second with `clients` concurrent clients.
fn throughput(
    client: &Client,
    server: &str,
    clients: usize,
    bodies: &[Vec<u8>],
    requests: usize,
) -> ThroughputRow {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(u16, f64)>> = Mutex::new(Vec::with_capacity(requests));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    return;
                }
                let r = match client.decide(&bodies[i % bodies.len()]) {
                    Ok(reply) => (reply.status, reply.wall_ms),
                    Err(_) => (0, f64::NAN),
                };
                if let Ok(mut all) = results.lock() {
                    all.push(r);
                }
            });
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    let results = results.into_inner().unwrap_or_default();
    let ok: Vec<f64> = results.iter().filter(|r| r.0 == 200).map(|r| r.1).collect();
    let refused = results.iter().filter(|r| r.0 == 429).count();
    ThroughputRow {
        server: server.to_string(),
        clients,
        requests,
        ok: ok.len(),
        refused,
        failed: results.len() - ok.len() - refused,
        seconds,
        requests_per_second: ok.len() as f64 / seconds,
        p50_ms: percentile(ok.clone(), 50.0),
        p99_ms: percentile(ok, 99.0),
    }
}

/// The latency cases and throughput table of the server at `url` (and the throughput of
/// `compare`, the server at `o.compare`, beside it).
pub fn run(
    client: &Client,
    url: &str,
    o: &HttpBenchOptions,
    compare: Option<&Client>,
) -> super::Result<HttpBenchReport> {
    let budget = Budget {
        start: Instant::now(),
        seconds: o.max_seconds,
    };
    let (status, models) = client.get("/v1/models")?;
    if status != 200 {
        refuse!("GET /v1/models answered {status}: {models}");
    }
    let models: Value = serde_json::from_str(&models)?;
    let card = models["models"][0].clone();
    let limit = card["limits"]["max_state_tokens"].as_u64().unwrap_or(16384) as usize;
    let (six, five) = (six_questions(), five_questions());
    let mut latency = Vec::new();
    if !o.skip_latency {
        latency = latency_cases(client, &budget, o, limit, &six, &five)?;
    }
    // The servers measured, as (client, label).
    let mut servers = vec![(client, server_label(url, &card))];
    if let (Some(second), Some(other)) = (compare, &o.compare) {
        let (status, text) = second.get("/v1/models")?;
        if status != 200 {
            refuse!("GET {other}/v1/models answered {status}: {text}");
        }
        let card2: Value = serde_json::from_str(&text)?;
        servers.push((second, server_label(other, &card2["models"][0])));
    }
    let bodies: Vec<Vec<u8>> = if o.short_tokens > 0 {
        // Distinct short states: every request of every pass its own (no prefix is shared).
        let three = three_questions();
        let words = words_for_input(client, o.short_tokens, &three)?;
        let total = 2 * o.requests * o.clients.len() * servers.len();
        (0..total.max(1))
            .map(|i| body(&state_text(words, 200_000 + i as u64), &three, false))
            .collect()
    } else {
        (0..o.states.max(1))
            .map(|i| body(&state_text(60, 50_000 + i as u64), &six, false))
            .collect()
    };
    let mut used = 0;
    let mut rows = Vec::new();
    for &clients in &o.clients {
        for &(c, ref label) in &servers {
            if !budget.left() {
                tracing::warn!("time budget spent: skipping {clients} clients on {label}");
                continue;
            }
            // Each pass takes the next bodies (distinct states stay distinct across passes).
            let mut pass = || {
                let slice: Vec<Vec<u8>> = (0..o.requests)
                    .map(|i| bodies[(used + i) % bodies.len()].clone())
                    .collect();
                used += o.requests;
                slice
            };
            eprintln!("throughput: {clients} clients on {label}, untimed pass");
            throughput(c, label, clients, &pass(), o.requests);
            eprintln!("throughput: {clients} clients on {label}, timed pass");
            rows.push(throughput(c, label, clients, &pass(), o.requests));
        }
    }
    Ok(HttpBenchReport {
        url: url.to_string(),
        model: json!({"name": card["name"], "precision": card["precision"], "mesh": card["mesh"],
                      "workers": card["workers"], "prefix_cache": card["prefix_cache"],
                      "cpu_kernels": card["cpu_kernels"]}),
        latency,
        throughput: rows,
    })
}

/// A server's label in the throughput table: its URL and packing budget.
fn server_label(url: &str, card: &Value) -> String {
    format!("{url} (pack_tokens {})", card["limits"]["pack_tokens"])
}

/// The latency cases: a short state, a long one and optionally one at the state limit.
fn latency_cases(
    client: &Client,
    budget: &Budget,
    o: &HttpBenchOptions,
    limit: usize,
    six: &Value,
    five: &Value,
) -> super::Result<Vec<LatencyRow>> {
    let mut latency = Vec::new();
    latency.push(latency_case(
        client,
        budget,
        "short state",
        six,
        false,
        o.warmup,
        o.samples,
        &|seed| state_text(40, seed),
    )?);
    let words = words_for_tokens(client, o.long_tokens, five)?;
    latency.push(latency_case(
        client,
        budget,
        &format!("{}-token state", o.long_tokens),
        five,
        false,
        o.warmup,
        o.samples,
        &|seed| state_text(words, seed),
    )?);
    if o.limit_samples > 0 {
        // More words than the limit holds; the server keeps the first `limit` tokens.
        let over = limit + limit / 4;
        latency.push(latency_case(
            client,
            budget,
            &format!("state piece at the {limit}-token limit"),
            five,
            true,
            o.limit_warmup,
            o.limit_samples,
            &|seed| state_text(over, seed),
        )?);
    }
    Ok(latency)
}

/// The report as markdown tables.
pub fn markdown(r: &HttpBenchReport) -> String {
    let mut s = String::from(
        "| case | questions | input tokens | new state model ms | repeated model ms | new state wall ms | repeated wall ms | samples |\n|---|---|---|---|---|---|---|---|\n",
    );
    for row in &r.latency {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} / {} |\n",
            row.case,
            row.questions,
            row.input_tokens,
            row.new_state.model_ms,
            row.repeated_state.model_ms,
            row.new_state.wall_ms,
            row.repeated_state.wall_ms,
            row.new_state.n,
            row.repeated_state.n
        ));
    }
    if !r.throughput.is_empty() {
        s.push_str("\n| server | clients | requests | ok | 429 | failed | seconds | requests/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for t in &r.throughput {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.0} | {:.0} |\n",
                t.server,
                t.clients,
                t.requests,
                t.ok,
                t.refused,
                t.failed,
                t.seconds,
                t.requests_per_second,
                t.p50_ms,
                t.p99_ms
            ));
        }
    }
    s
}
