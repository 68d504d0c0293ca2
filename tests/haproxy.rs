//! Replicas behind the real HAProxy (`deploy/haproxy/haproxy.cfg`, run as it is): three
//! `clef-tt serve --settings profiles/p150x2.toml` replicas (the P150x2 serve profile on the host
//! shim's simulated devices) on loopback ports. Repeats of a state keyed by `x-clef-state-key`
//! land on the replica that saw it first and hit its prefix cache; without the header the hit
//! rate is printed for comparison; a replica killed with SIGKILL under load loses no request
//! (every answer 200 or 429 and equal to its solo answer), its states move and the others' stay;
//! a restarted replica is back in rotation after its warm-up and gets nothing before it.
//!
//! Needs `haproxy` on the PATH (`.ci/run` installs Debian's and sets CLEF_REQUIRE_HAPROXY=1);
//! without it the test says so and passes.

mod common;

use common::process::{clef_tt, Server};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn haproxy() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("haproxy"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CLEF_REQUIRE_HAPROXY").is_none(),
            "CLEF_REQUIRE_HAPROXY is set but haproxy is not on the PATH"
        );
        eprintln!("SKIPPED: haproxy is not installed (apt-get install haproxy)");
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// A replica from the P150x2 serve profile, its log in `log`.
fn start_replica(port: u16, log: &Path) -> Server {
    let file = std::fs::File::create(log).unwrap();
    let child = clef_tt()
        .args(["serve", "--settings"])
        .arg(repo().join("profiles/p150x2.toml"))
        .args(["--port", &port.to_string()])
        .env("CLEF_LOG", "info")
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

fn body(state: &str) -> String {
    serde_json::json!({
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

/// The key a client library computes (README, "Serving on several boxes").
fn client_key(state: &str) -> String {
    Sha256::digest(state.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Reply {
    status: u16,
    replica: String,
    cache: String,
    state_key: String,
    /// The body without `latency_ms`.
    answer: Value,
}

fn send(url: &str, body: &str, key: Option<&str>) -> Result<Reply, ureq::Error> {
    let mut req = agent()
        .post(&format!("{url}/v1/systemone"))
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("x-clef-state-key", k);
    }
    let mut r = req.send(body.as_bytes())?;
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (replica, cache, state_key) = (
        header("x-clef-replica"),
        header("x-clef-prefix-cache"),
        header("x-clef-state-key"),
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
        answer,
    })
}

#[test]
fn replicas_behind_haproxy_keep_states_on_their_prefix_caches_and_survive_a_kill() {
    let Some(haproxy) = haproxy() else { return };
    let dir = std::env::temp_dir().join(format!("clef-haproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut replicas: Vec<Option<Server>> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| Some(start_replica(p, &dir.join(format!("r{}.log", i + 1)))))
        .collect();
    for &p in &ports {
        wait_healthy(&format!("http://127.0.0.1:{p}"));
    }
    let (front, stats) = (free_port(), free_port());
    let proxy_log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
    let mut proxy = Command::new(&haproxy);
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
    let _proxy = Proxy(proxy.spawn().unwrap());
    let url = format!("http://127.0.0.1:{front}");
    let stats_url = format!("http://127.0.0.1:{stats}");
    // Every replica up in HAProxy's eyes (rise 2 x 300 ms).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = agent()
            .get(&format!("{stats_url}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        let up = text
            .lines()
            .filter(|l| l.starts_with("haproxy_server_status{") && l.contains("state=\"UP\""))
            .filter(|l| l.ends_with(" 1"))
            .count();
        if up == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "HAProxy did not see 3 replicas up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Solo answers straight from replica 1 (every replica serves the same model).
    let keyed: Vec<String> = (0..6).map(|i| state(&format!("K{i}"))).collect();
    let unkeyed: Vec<String> = (0..6).map(|i| state(&format!("U{i}"))).collect();
    let direct = format!("http://127.0.0.1:{}", ports[0]);
    let solo: HashMap<String, Value> = keyed
        .iter()
        .chain(&unkeyed)
        .map(|s| (s.clone(), send(&direct, &body(s), None).unwrap().answer))
        .collect();

    // 1. With the header: 10 rounds over 6 states.
    let mut home: HashMap<&str, String> = HashMap::new();
    let (mut repeats, mut hits) = (0, 0);
    for round in 0..10 {
        for s in &keyed {
            let key = client_key(s);
            let r = send(&url, &body(s), Some(&key)).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.state_key, key, "the server's key is the client's");
            assert_eq!(r.answer, solo[s]);
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

    // 2. Without it (round-robin): measured for comparison.
    let (mut repeats, mut hits) = (0, 0);
    for round in 0..10 {
        for s in &unkeyed {
            let r = send(&url, &body(s), None).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.answer, solo[s]);
            if round > 0 {
                repeats += 1;
                hits += usize::from(r.cache == "hit");
            }
        }
    }
    eprintln!(
        "without the header (round-robin): {hits}/{repeats} repeats hit ({:.0}%)",
        hits as f64 * 100.0 / repeats as f64
    );

    // 3. SIGKILL the replica holding the most keyed states, under load from 4 clients.
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
                    let r = send(&url, &body(s), Some(&client_key(s)));
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
    let mut dead = replicas[index].take().unwrap();
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
                assert_eq!(r.answer, solo[s], "an answer changed under the kill");
            }
            429 => busy += 1,
            other => panic!(
                "status {other} under the kill from {:?}: {}\n{}",
                r.replica,
                r.answer,
                std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
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
        "kill {victim} under load: {} requests, {ok} x 200, {busy} x 429, none lost; \
         its {victim_states} states moved to {:?}",
        replies.len(),
        moved_to.values().collect::<HashSet<_>>()
    );
    assert!(ok > 0 && moved_to.len() == victim_states);

    // 4. Restart it: back in rotation after its warm-up, nothing before.
    let log = dir.join(format!("{victim}-restart.log"));
    replicas[index] = Some(start_replica(ports[index], &log));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut back = false;
    while Instant::now() < deadline && !back {
        for s in &keyed {
            if home[s.as_str()] != victim {
                continue;
            }
            let r = send(&url, &body(s), Some(&client_key(s))).unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.answer, solo[s]);
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
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_kubernetes_haproxy_config_is_valid() {
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
    std::fs::write(&path, config).unwrap();
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
}
