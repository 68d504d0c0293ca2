//! Replicas behind the real HAProxy (`deploy/haproxy/haproxy.cfg`, run as it is): three
//! `clef-tt serve --settings profiles/p150x2.toml` replicas (the P150x2 serve profile on the host
//! shim's simulated devices) on loopback ports, one test walking through:
//!
//! 1. repeats of a state keyed by the client's `x-clef-state-key` land on the replica that saw it
//!    first and hit its prefix cache;
//! 2. for a body without the header HAProxy computes the key itself exactly when the state is
//!    text without media — equal, byte for byte, to the key clef-tt answers with — and
//!    computes none otherwise (JSON states, media, escapes it cannot read);
//! 3. the unmodified Python SDK (no header) repeating text states hits the prefix cache from the
//!    first repeat on (`tests/clients/python_sdk_affinity.py`); it, urllib, requests and httpx
//!    read the 413 of a body over the limit (14, 64 MiB, chunked) and a 415
//!    (`tests/clients/oversize_bodies.py`);
//! 4. JSON states without the header go round-robin (the hit rate printed for comparison);
//! 5. request ids: a client's well-formed `x-request-id` comes back and is in HAProxy's and the
//!    replica's logs, a malformed or missing one is replaced by HAProxy's UUID, logged alike;
//! 6. a replica killed with SIGKILL under load (clients sending no header) loses no request
//!    (every answer 200 or 429 and equal to its solo answer), its states move and the others'
//!    stay;
//! 7. a restarted replica is back in rotation after its warm-up and gets nothing before it;
//! 8. a replica whose device stops answering under load (the shim's `CLEF_TT_HANG` fault)
//!    loses no request: it answers 503 after its device deadline, HAProxy replays those
//!    requests elsewhere, and it exits with status 75 after its drain window.
//!
//! Needs `haproxy` on the PATH (`.ci/run` installs Debian's and sets CLEF_REQUIRE_HAPROXY=1)
//! and, for step 3, a Python with `typesafe-sdk` 0.7 (`CLEF_SDK_PYTHON`, else `python3`);
//! without them the test says so and passes (with CLEF_REQUIRE_HAPROXY set it fails instead).

mod common;

use common::process::{clef_tt, free_port, wait_exit, Server};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn required() -> bool {
    std::env::var_os("CLEF_REQUIRE_HAPROXY").is_some()
}

fn haproxy() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("haproxy"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            !required(),
            "CLEF_REQUIRE_HAPROXY is set but haproxy is not on the PATH"
        );
        eprintln!("SKIPPED: haproxy is not installed (apt-get install haproxy)");
    }
    found
}

/// A Python that imports `typesafe_sdk`: `CLEF_SDK_PYTHON`, else `python3`.
fn sdk_python() -> Option<PathBuf> {
    let python = std::env::var_os("CLEF_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "python3".into());
    let works = Command::new(&python)
        .args(["-c", "import typesafe_sdk"])
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Some(python);
    }
    assert!(
        !required(),
        "CLEF_REQUIRE_HAPROXY is set but {python:?} cannot import typesafe_sdk: set \
         CLEF_SDK_PYTHON to a Python with typesafe-sdk 0.7 (pip install 'typesafe-sdk==0.7.*')"
    );
    eprintln!("SKIPPED (the SDK step): no Python with typesafe-sdk (set CLEF_SDK_PYTHON)");
    None
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// A replica from the P150x2 serve profile on the host shim (named, so that a ttnn shim built
/// beside the binary is not picked), its log in `log`.
fn start_replica(port: u16, log: &Path) -> Server {
    start_replica_with(port, log, &[])
}

/// [`start_replica`] with more environment.
fn start_replica_with(port: u16, log: &Path, env: &[(&str, &str)]) -> Server {
    let file = std::fs::File::create(log).unwrap();
    let host_shim = Path::new(env!("CARGO_BIN_EXE_clef-tt")).with_file_name("libclef_tt_host.so");
    let child = clef_tt()
        .args(["serve", "--settings"])
        .arg(repo().join("profiles/p150x2.toml"))
        .args(["--port", &port.to_string()])
        .env("CLEF_TT_SHIM", host_shim)
        .env("CLEF_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap();
    Server(child)
}

fn wait_healthy(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if agent()
            .get(&format!("{base}/health"))
            .call()
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{base} did not become healthy");
}

/// HAProxy on the project's config, stopped when dropped.
struct Proxy(std::process::Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A decision's state text: long enough for a cacheable state piece (over 128 tokens).
fn state(name: &str) -> String {
    format!(
        "Ticket {name}: {}",
        "The checkout page returns errors for some customers and orders are stuck. ".repeat(12)
    )
}

fn body_with(state: Value) -> String {
    json!({
        "model": "clef",
        "state": state,
        "questions": {
            "outage": {"type": "noul", "instructions": "Is a service down?"},
            "team": {"type": "choice", "instructions": "Which team?",
                     "criteria": {"billing": "Payments", "technical": "Bugs and outages"}},
        },
    })
    .to_string()
}

fn body(state: &str) -> String {
    body_with(Value::from(state))
}

/// The key a client library computes (docs/scale-out.md, "Serving on several boxes").
fn client_key(state: &str) -> String {
    Sha256::digest(state.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// HAProxy's own request ids: UUIDs.
fn is_uuid(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

struct Reply {
    status: u16,
    replica: String,
    cache: String,
    state_key: String,
    /// The key HAProxy balanced on (empty: round-robin).
    balance_key: String,
    request_id: String,
    /// The body without `latency_ms`.
    answer: Value,
}

fn send(url: &str, body: &str, headers: &[(&str, &str)]) -> Result<Reply, ureq::Error> {
    let mut req = agent()
        .post(&format!("{url}/v1/systemone"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send(body.as_bytes())?;
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (replica, cache, state_key, balance_key, request_id) = (
        header("x-clef-replica"),
        header("x-clef-prefix-cache"),
        header("x-clef-state-key"),
        header("x-clef-balance-key"),
        header("x-request-id"),
    );
    // HAProxy's own refusals are HTML: keep them as text for the assertion to show.
    let text = r.body_mut().read_to_string()?;
    let mut answer: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if let Some(o) = answer.as_object_mut() {
        o.remove("latency_ms");
    }
    Ok(Reply {
        status: r.status().as_u16(),
        replica,
        cache,
        state_key,
        balance_key,
        request_id,
        answer,
    })
}

/// Three replicas behind HAProxy, the logs in `dir`.
struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
    replicas: Vec<Option<Server>>,
    url: String,
    /// HAProxy's stats port (Prometheus at /metrics).
    stats: u16,
    _proxy: Proxy,
}

impl Cluster {
    fn start(haproxy: &Path) -> Cluster {
        let dir = std::env::temp_dir().join(format!("clef-haproxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let replicas: Vec<Option<Server>> = ports
            .iter()
            .enumerate()
            .map(|(i, &p)| Some(start_replica(p, &dir.join(format!("r{}.log", i + 1)))))
            .collect();
        for &p in &ports {
            wait_healthy(&format!("http://127.0.0.1:{p}"));
        }
        let (front, stats) = (free_port(), free_port());
        let proxy_log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
        let mut proxy = Command::new(haproxy);
        proxy
            .args(["-db", "-f"])
            .arg(repo().join("deploy/haproxy/haproxy.cfg"))
            .env("CLEF_HAPROXY_BIND", format!("127.0.0.1:{front}"))
            .env("CLEF_HAPROXY_STATS", format!("127.0.0.1:{stats}"))
            .env("CLEF_HAPROXY_CHECK", "300ms")
            .stdout(proxy_log.try_clone().unwrap())
            .stderr(proxy_log);
        for (i, p) in ports.iter().enumerate() {
            proxy.env(format!("CLEF_REPLICA_{}", i + 1), format!("127.0.0.1:{p}"));
        }
        let proxy = Proxy(proxy.spawn().unwrap());
        let cluster = Cluster {
            dir,
            ports,
            replicas,
            url: format!("http://127.0.0.1:{front}"),
            stats,
            _proxy: proxy,
        };
        cluster.wait_up(3);
        cluster
    }

    /// Until HAProxy sees `n` replicas up (rise 2 x 300 ms).
    fn wait_up(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = agent()
                .get(&format!("http://127.0.0.1:{}/metrics", self.stats))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .unwrap_or_default();
            let up = text
                .lines()
                .filter(|l| l.starts_with("haproxy_server_status{") && l.contains("state=\"UP\""))
                .filter(|l| l.ends_with(" 1"))
                .count();
            if up == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "HAProxy did not see {n} replicas up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Wait until the log of `name` (`haproxy`, `r1`, ...) contains `needle`.
    fn logged(&self, name: &str, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.log(name).contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

#[test]
fn replicas_behind_haproxy_keep_states_on_their_prefix_caches_and_survive_a_kill() {
    let Some(haproxy) = haproxy() else { return };
    let python = sdk_python();
    let mut cluster = Cluster::start(&haproxy);
    let url = cluster.url.clone();

    // Solo answers straight from replica 1 (every replica serves the same model).
    let keyed: Vec<String> = (0..6).map(|i| state(&format!("K{i}"))).collect();
    let unkeyed: Vec<Value> = (0..6)
        // Rendered with sorted keys, so `text` leads: each differs from its first token.
        .map(|i| json!({"ticket": i, "text": state(&format!("U{i}"))}))
        .collect();
    let direct = format!("http://127.0.0.1:{}", cluster.ports[0]);
    let mut solo: HashMap<String, Value> = HashMap::new();
    for b in keyed
        .iter()
        .map(|s| body(s))
        .chain(unkeyed.iter().map(|s| body_with(s.clone())))
    {
        let answer = send(&direct, &b, &[]).unwrap().answer;
        solo.insert(b, answer);
    }

    // 1. With the client's header: 10 rounds over 6 states.
    let mut home: HashMap<&str, String> = HashMap::new();
    let (mut repeats, mut hits) = (0, 0);
    for round in 0..10 {
        for s in &keyed {
            let key = client_key(s);
            let r = send(&url, &body(s), &[("x-clef-state-key", &key)]).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.state_key, key, "the server's key is the client's");
            assert_eq!(r.balance_key, key, "balanced on the client's key");
            assert_eq!(r.answer, solo[&body(s)]);
            let first = home.entry(s.as_str()).or_insert_with(|| r.replica.clone());
            assert_eq!(&r.replica, first, "a repeat of a state moved");
            if round > 0 {
                repeats += 1;
                hits += usize::from(r.cache == "hit");
            }
        }
    }
    let keyed_rate = hits as f64 / repeats as f64;
    let homes: HashSet<&String> = home.values().collect();
    eprintln!(
        "with x-clef-state-key: {hits}/{repeats} repeats hit ({:.0}%), states on {} replicas",
        keyed_rate * 100.0,
        homes.len()
    );
    assert!(keyed_rate >= 0.9, "{hits}/{repeats}");

    // 2. Without it, HAProxy computes the key of a text state without media: exactly the
    // server's, whatever JSON escapes the client used; and none where it cannot.
    let texts = [
        r#""plain ASCII text""#,
        r#""raw UTF-8: é 中 😀 — ü""#,
        r#""escapes: \" \\ \/ no""#, // `\/`: HAProxy cannot read it (no key), see below
        r#""escapes: \" \\ \n \t \r \b \f \u0001 \u001f \u0041""#,
        r#""""#,
    ];
    for text in texts {
        let raw = format!(
            r#"{{"model":"clef","state":{text},"questions":{{"q":{{"type":"noul","instructions":"?"}}}},"images":[]}}"#
        );
        let r = send(&url, &raw, &[]).unwrap();
        assert_eq!(r.status, 200, "{raw}: {}", r.answer);
        let state: String = serde_json::from_str(text).unwrap();
        assert_eq!(r.state_key, client_key(&state), "{text}");
        if text.contains(r"\/") {
            assert_eq!(r.balance_key, "", "{text}: HAProxy does not read `\\/`");
        } else {
            assert_eq!(
                r.balance_key, r.state_key,
                "{text}: HAProxy's key is the server's"
            );
        }
    }
    let no_key = [
        body_with(json!({"ticket": 1, "text": "a JSON state"})),
        body_with(json!(["a", "list"])),
        body_with(json!(42)),
        body_with(json!(null)),
        // ASCII-escaped non-ASCII text (Python's json.dumps default): not read, or not as UTF-8.
        r#"{"model":"clef","state":"caf\u00e9","questions":{"q":{"type":"noul"}}}"#.into(),
        r#"{"model":"clef","state":"\u4e2d\u6587","questions":{"q":{"type":"noul"}}}"#.into(),
        // Media: the key covers them.
        r#"{"model":"clef","state":"text","images":["x"],"questions":{"q":{"type":"noul"}}}"#
            .into(),
        r#"{"model":"clef","state":"text","videos":[["x"]],"questions":{"q":{"type":"noul"}}}"#
            .into(),
        // `state` twice (clef-tt reads the last).
        r#"{"model":"clef","state":"a","state":"b","questions":{"q":{"type":"noul"}}}"#.into(),
    ];
    for raw in &no_key {
        let r = send(&url, raw, &[]).unwrap();
        assert!(matches!(r.status, 200 | 422), "{raw}: {}", r.answer);
        assert_eq!(r.balance_key, "", "{raw}: no key computed");
    }
    // The client's header wins over the computed key.
    let r = send(&url, &body(&keyed[0]), &[("x-clef-state-key", "mine")]).unwrap();
    assert_eq!((r.status, r.balance_key.as_str()), (200, "mine"));
    eprintln!(
        "computed keys: {} text states equal to the server's, {} bodies without one",
        texts.len() - 1,
        no_key.len() + 1
    );

    // 3. The unmodified Python SDK, repeating text states with no header.
    if let Some(python) = &python {
        sdk_repeats_hit_the_cache(&url, python);
        // ... and with urllib, requests, httpx and the SDK, bodies over the limit (14 and 64
        // MiB, chunked) and of another content type: each reads the refusal through HAProxy.
        refusals_are_read(&url, python);
    }

    // 4. JSON states without the header: round-robin, measured for comparison (the order
    // rotated each round, as clients that do not take turns would send; in one fixed order, 6
    // states over 3 replicas would meet round-robin's own cycle).
    let (mut repeats, mut hits, mut used) = (0, 0, HashSet::new());
    for round in 0..10 {
        for i in 0..unkeyed.len() {
            let s = &unkeyed[(i + round) % unkeyed.len()];
            let b = body_with(s.clone());
            let r = send(&url, &b, &[]).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.balance_key, "");
            assert_eq!(r.answer, solo[&b]);
            used.insert(r.replica.clone());
            if round > 0 {
                repeats += 1;
                hits += usize::from(r.cache == "hit");
            }
        }
    }
    eprintln!(
        "JSON states without the header (round-robin over {} replicas): {hits}/{repeats} \
         repeats hit ({:.0}%)",
        used.len(),
        hits as f64 * 100.0 / repeats as f64
    );

    // 5. Request ids through HAProxy, in its log and the replica's.
    let id = "client-7f3a.req:42";
    let r = send(&url, &body(&keyed[1]), &[("x-request-id", id)]).unwrap();
    assert_eq!((r.status, r.request_id.as_str()), (200, id));
    assert!(cluster.logged("haproxy", &format!("{{{id}}}")));
    assert!(cluster.logged(&r.replica, &format!("id={id}")));
    let long = "x".repeat(129);
    for sent in [Some("has space"), Some(long.as_str()), None] {
        let headers: Vec<(&str, &str)> = sent.map(|v| ("x-request-id", v)).into_iter().collect();
        let r = send(&url, &body(&keyed[1]), &headers).unwrap();
        assert_eq!(r.status, 200);
        assert!(is_uuid(&r.request_id), "{sent:?} -> {}", r.request_id);
        assert!(cluster.logged("haproxy", &format!("{{{}}}", r.request_id)));
        assert!(cluster.logged(&r.replica, &format!("id={}", r.request_id)));
    }
    eprintln!("request ids: the client's kept, malformed and missing ones HAProxy's, in both logs");

    // 6. SIGKILL the replica holding the most keyed states, under load from 4 clients that
    // send no header (HAProxy computes the keys).
    let victim = ["r1", "r2", "r3"]
        .into_iter()
        .max_by_key(|r| home.values().filter(|h| h.as_str() == *r).count())
        .unwrap()
        .to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at = Arc::new(Mutex::new(None::<Instant>));
    let replies = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, replies, keyed, url) =
                (stop.clone(), replies.clone(), keyed.clone(), url.clone());
            let killed_at = killed_at.clone();
            std::thread::spawn(move || {
                let mut i = c;
                while !stop.load(Ordering::SeqCst) {
                    let s = &keyed[i % keyed.len()];
                    let sent = Instant::now();
                    let r = send(&url, &body(s), &[]);
                    let after_kill = killed_at.lock().unwrap().is_some_and(|k| sent > k);
                    replies.lock().unwrap().push((
                        s.clone(),
                        after_kill,
                        r.map_err(|e| e.to_string()),
                    ));
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let index: usize = victim[1..].parse::<usize>().unwrap() - 1;
    let mut dead = cluster.replicas[index].take().unwrap();
    let _ = dead.0.kill(); // SIGKILL
    let _ = dead.0.wait();
    *killed_at.lock().unwrap() = Some(Instant::now());
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let replies = std::mem::take(&mut *replies.lock().unwrap());
    let (mut ok, mut busy, mut moved_to) = (0, 0, HashMap::new());
    for (s, after_kill, r) in &replies {
        let r = r
            .as_ref()
            .unwrap_or_else(|e| panic!("a request was lost: {e}"));
        match r.status {
            200 => {
                ok += 1;
                assert_eq!(r.answer, solo[&body(s)], "an answer changed under the kill");
                assert_eq!(r.balance_key, client_key(s), "HAProxy's key under the kill");
            }
            429 => busy += 1,
            other => panic!(
                "status {other} under the kill from {:?}: {}\n{}",
                r.replica,
                r.answer,
                cluster.log("haproxy")
            ),
        }
        if *after_kill && r.status == 200 {
            let was = &home[s.as_str()];
            if *was == victim {
                assert_ne!(r.replica, victim, "sent to the dead replica");
                moved_to.insert(s.clone(), r.replica.clone());
            } else {
                assert_eq!(&r.replica, was, "a live replica's state moved");
            }
        }
    }
    let victim_states = home.values().filter(|h| **h == victim).count();
    eprintln!(
        "kill {victim} under load (no client header): {} requests, {ok} x 200, {busy} x 429, \
         none lost; its {victim_states} states moved to {:?}",
        replies.len(),
        moved_to.values().collect::<HashSet<_>>()
    );
    assert!(ok > 0 && moved_to.len() == victim_states);

    // 7. Restart it: back in rotation after its warm-up, nothing before.
    let log = cluster.dir.join(format!("{victim}-restart.log"));
    cluster.replicas[index] = Some(start_replica(cluster.ports[index], &log));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut back = false;
    while Instant::now() < deadline && !back {
        for s in &keyed {
            if home[s.as_str()] != victim {
                continue;
            }
            let r = send(&url, &body(s), &[]).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.answer, solo[&body(s)]);
            back |= r.replica == victim;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(back, "the restarted replica never got its states back");
    let text = std::fs::read_to_string(&log).unwrap();
    let warm = text
        .find("warm-up done")
        .expect("the restarted replica warmed up");
    let first_request = text
        .find("systemone")
        .expect("the restarted replica answered");
    assert!(
        warm < first_request,
        "a request reached the replica before its warm-up finished"
    );
    eprintln!("restart {victim}: back in rotation after its warm-up, its states home again");

    // 8. The replica holding the most keyed states again, restarted with a device that stops
    // answering (the shim's fault CLEF_TT_HANG: the 3rd linear of its first request never
    // returns), under load from 4 clients that send no header. After its 1 s device deadline
    // it answers its requests 503, HAProxy replays them elsewhere (retry-on 503), /health takes
    // it out, and it exits with status 75 after its 2 s drain. No request is lost.
    let hung = ["r1", "r2", "r3"]
        .into_iter()
        .max_by_key(|r| home.values().filter(|h| h.as_str() == *r).count())
        .unwrap()
        .to_string();
    let hung_index: usize = hung[1..].parse::<usize>().unwrap() - 1;
    drop(cluster.replicas[hung_index].take());
    let log = cluster.dir.join(format!("{hung}-hang.log"));
    let fault = [
        ("CLEF_TT_HANG", "linear:3"),
        ("CLEF_DEVICE_TIMEOUT", "1"),
        ("CLEF_SHUTDOWN_TIMEOUT", "2"),
        ("CLEF_WARMUP", "0"),
    ];
    let mut replica = start_replica_with(cluster.ports[hung_index], &log, &fault);
    wait_healthy(&format!("http://127.0.0.1:{}", cluster.ports[hung_index]));
    cluster.wait_up(3);
    let stop = Arc::new(AtomicBool::new(false));
    let replies = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (stop, replies, keyed, url) =
                (stop.clone(), replies.clone(), keyed.clone(), url.clone());
            std::thread::spawn(move || {
                let mut i = c;
                while !stop.load(Ordering::SeqCst) {
                    let s = &keyed[i % keyed.len()];
                    let r = send(&url, &body(s), &[]);
                    replies
                        .lock()
                        .unwrap()
                        .push((s.clone(), r.map_err(|e| e.to_string())));
                    i += 1;
                }
            })
        })
        .collect();
    let status = wait_exit(&mut replica, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(
        status.code(),
        Some(75),
        "{}",
        cluster.log(&format!("{hung}-hang"))
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("device deadline missed"), "{text}");
    let replies = std::mem::take(&mut *replies.lock().unwrap());
    let mut ok = 0;
    for (s, r) in &replies {
        let r = r
            .as_ref()
            .unwrap_or_else(|e| panic!("a request was lost to the hung replica: {e}"));
        match r.status {
            200 => {
                ok += 1;
                assert_eq!(r.answer, solo[&body(s)], "an answer changed under the hang");
                assert_ne!(r.replica, hung, "the hung replica answered");
            }
            429 => {}
            other => panic!(
                "status {other} under the hang from {:?}: {}\n{}",
                r.replica,
                r.answer,
                cluster.log("haproxy")
            ),
        }
    }
    eprintln!(
        "device hang on {hung} under load: {} requests, {ok} x 200, none lost; it exited with \
         status 75",
        replies.len()
    );
    assert!(ok > 0);
    let dir = cluster.dir.clone();
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Step 3, refusals: `tests/clients/oversize_bodies.py` through HAProxy, every client reads the
/// 413 (or 415) and its JSON body, none a broken pipe.
fn refusals_are_read(url: &str, python: &Path) {
    let out = Command::new(python)
        .arg(repo().join("tests/clients/oversize_bodies.py"))
        .arg(url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !(required() && text.contains("skipped")),
        "CLEF_SDK_PYTHON lacks a client (pip install requests httpx):\n{text}"
    );
    eprintln!("through HAProxy: {}", text.lines().last().unwrap_or(""));
}

/// Step 3: 6 text states x 5 rounds from `tests/clients/python_sdk_affinity.py` (the SDK as an
/// application uses it): every request balanced on HAProxy's key, equal to the server's; each
/// state on one replica; at least 95% of the repeats (every request after a state's first) hit
/// its prefix cache; the SDK's request id is HAProxy's.
fn sdk_repeats_hit_the_cache(url: &str, python: &Path) {
    let states: Vec<String> = (0..6).map(|i| state(&format!("S{i}"))).collect();
    let mut child = Command::new(python)
        .arg(repo().join("tests/clients/python_sdk_affinity.py"))
        .args([url, "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&states).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30);
    let (mut repeats, mut hits) = (0, 0);
    let mut replica_of: HashMap<u64, String> = HashMap::new();
    for line in &lines {
        let text = |k: &str| line[k].as_str().unwrap_or("").to_string();
        let index = line["state"].as_u64().unwrap();
        let state = &states[index as usize];
        assert_eq!(text("state_key"), client_key(state), "{line}");
        assert_eq!(
            text("balance_key"),
            text("state_key"),
            "HAProxy computed the server's key for the SDK's body (an SDK that compresses \
             bodies, Python >= 3.14, would need compression=False): {line}"
        );
        let first = replica_of.entry(index).or_insert_with(|| text("replica"));
        assert_eq!(*first, text("replica"), "a repeat moved: {line}");
        assert!(is_uuid(&text("request_id")), "{line}");
        assert_eq!(text("request_id"), text("x-request-id"), "{line}");
        if line["round"].as_u64().unwrap() > 0 {
            repeats += 1;
            hits += usize::from(text("cache") == "hit");
        }
    }
    let homes: HashSet<&String> = replica_of.values().collect();
    eprintln!(
        "Python SDK, no header, 6 text states x 5: {hits}/{repeats} repeats hit ({:.0}%), \
         states on {} replicas",
        hits as f64 * 100.0 / repeats as f64,
        homes.len()
    );
    assert!(hits as f64 >= 0.95 * repeats as f64, "{hits}/{repeats}");
}

#[test]
fn the_kubernetes_haproxy_config_is_valid_and_balances_as_the_deploy_config() {
    let Some(haproxy) = haproxy() else { return };
    let manifest = std::fs::read_to_string(repo().join("deploy/k8s/clef-tt.yaml")).unwrap();
    let embedded = manifest
        .split("haproxy.cfg: |\n")
        .nth(1)
        .and_then(|rest| rest.split("\n---").next())
        .expect("the clef-haproxy ConfigMap");
    let config: String = embedded
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let path = std::env::temp_dir().join(format!("clef-k8s-haproxy-{}.cfg", std::process::id()));
    std::fs::write(&path, &config).unwrap();
    let out = Command::new(haproxy)
        .args(["-c", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The request-id and routing-key rules are the deploy config's, line for line.
    let deploy = std::fs::read_to_string(repo().join("deploy/haproxy/haproxy.cfg")).unwrap();
    let rules = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| {
                [
                    "acl ",
                    "http-request ",
                    "http-response ",
                    "unique-id",
                    "balance ",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            })
            .filter(|l| !l.contains("prometheus-exporter"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(rules(&config), rules(&deploy));
}
