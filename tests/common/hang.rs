//! The device deadline as a client and a supervisor see it, on any Tenstorrent shim: a server
//! whose device stops answering (the shim core's fault `CLEF_TT_HANG=op:N`) answers the request
//! it was running and the one queued behind it with a 503 (`device_unavailable`, with
//! `Retry-After`) after its deadline, refuses new ones the same way, says why on `/health`
//! (503, `device_hung`), and exits with status 75 after its drain window.

use super::process::{spawn_logged, wait_exit, Server};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// A decision's status, `Retry-After` and body.
fn post(agent: &ureq::Agent, base: &str, body: &str) -> (u16, Option<String>, Value) {
    let mut r = agent
        .post(&format!("{base}/v1/systemone"))
        .header("content-type", "application/json")
        .send(body.as_bytes())
        .unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        retry,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn assert_unavailable((status, retry, body): &(u16, Option<String>, Value), what: &str) {
    assert_eq!(*status, 503, "{what}: {body}");
    assert_eq!(retry.as_deref(), Some("1"), "{what}: Retry-After");
    assert_eq!(
        body["error"]["type"], "device_unavailable",
        "{what}: {body}"
    );
}

/// Runs the scenario on a server started with `args` and `env` (plus the fault at `hang`, e.g.
/// `linear:3`, a 1 s deadline and a 2 s drain), logging to `log`; `body` is a request whose
/// run reaches the fault.
pub fn a_hung_device_is_refused_reported_and_exited(
    args: &[&str],
    env: &[(&str, &str)],
    hang: &str,
    body: &str,
    log: &Path,
) {
    let mut all: Vec<(&str, &str)> = env.to_vec();
    all.extend([
        ("CLEF_TT_HANG", hang),
        ("CLEF_DEVICE_TIMEOUT", "1"),
        ("CLEF_SHUTDOWN_TIMEOUT", "2"),
        ("CLEF_WARMUP", "0"),
    ]);
    let (mut server, base, agent): (Server, String, ureq::Agent) = spawn_logged(args, &all, log);
    let t0 = Instant::now();
    let (running, queued) = {
        let (b1, b2) = (base.clone(), base.clone());
        let (a1, a2) = (agent.clone(), agent.clone());
        let (body1, body2) = (body.to_string(), body.to_string());
        let running = std::thread::spawn(move || post(&a1, &b1, &body1));
        std::thread::sleep(Duration::from_millis(200));
        let queued = std::thread::spawn(move || post(&a2, &b2, &body2));
        (running.join().unwrap(), queued.join().unwrap())
    };
    assert_unavailable(&running, "the request on the hung device");
    assert_unavailable(&queued, "the request queued behind it");
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "answered before the deadline"
    );
    assert_unavailable(&post(&agent, &base, body), "a new request");
    let mut r = agent.get(&format!("{base}/health")).call().unwrap();
    assert_eq!(r.status(), 503);
    let health: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(health["status"], "device_hung", "{health}");
    assert!(
        health["reason"]
            .as_str()
            .is_some_and(|r| r.contains("CLEF_DEVICE_TIMEOUT")),
        "{health}"
    );
    let status = wait_exit(&mut server, Duration::from_secs(30));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(status.code(), Some(75), "{text}");
    assert!(text.contains("device deadline missed"), "{text}");
}
