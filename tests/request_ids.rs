//! Request ids on a real `clef-tt serve` process logging into a file: a client's well-formed
//! `x-request-id` (1 to 128 visible ASCII characters) is kept on every route — answered as
//! `x-request-id`, `x-typesafe-request-id` and Workers AI's `cf-ai-req-id`, and in the request's
//! log line — while a malformed (a space, a tab, too long, past ASCII, repeated) or missing one is
//! replaced by the server's own, answered and logged alike; the worker's lines about a request
//! (abandoned in the queue, cancelled between prefill chunks, both counted in `/metrics`) name
//! it too.

mod common;

use common::server::{agent, get, metric_value, triage};
use std::time::Duration;

/// `clef-tt serve` as a process logging at info into a file: (server, base URL, log path).
fn logged_server(dir: &std::path::Path) -> (common::process::Server, String, std::path::PathBuf) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.join("serve.log");
    let child = common::process::clef_tt()
        .args(["serve", "--port", &port.to_string()])
        .env("CLEF_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = common::process::Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while get_status(&base, "/health") != Some(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, base, log)
}

fn get_status(base: &str, path: &str) -> Option<u16> {
    agent()
        .get(&format!("{base}{path}"))
        .call()
        .ok()
        .map(|r| r.status().as_u16())
}

/// Wait until `log` has a line containing every one of `parts`.
fn log_has(log: &std::path::Path, parts: &[&str]) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The request's ids on an answer: `x-request-id`, and `x-typesafe-request-id` and Workers
/// AI's `cf-ai-req-id` when present, which must all agree.
fn answer_id(r: &ureq::http::Response<ureq::Body>) -> String {
    let h = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let id = h("x-request-id").expect("x-request-id");
    for other in ["x-typesafe-request-id", "cf-ai-req-id"] {
        if let Some(v) = h(other) {
            assert_eq!(v, id, "{other}");
        }
    }
    id
}

fn server_made(id: &str) -> bool {
    id.len() == 20 && id.starts_with("req_") && id[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[test]
fn a_well_formed_request_id_is_kept_echoed_and_logged_others_are_replaced() {
    let dir = std::env::temp_dir().join(format!("clef-request-ids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_server, base, log) = logged_server(&dir);
    let call = |method: &str, path: &str, id: Option<&str>, body: &str| {
        let mut req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("content-type", "application/json");
        if let Some(id) = id {
            // From bytes: a value past ASCII is obs-text, which HTTP allows and a client may send.
            let value = ureq::http::HeaderValue::from_bytes(id.as_bytes()).unwrap();
            req = req.header("x-request-id", value);
        }
        agent().run(req.body(body.to_string()).unwrap()).unwrap()
    };
    let hosted = "/accounts/a/ai/run/@cf/cloudflare/clef";
    let hosted_body =
        r#"{"model":"clef","state":"s","questions":{"q":{"type":"noul","instructions":"?"}}}"#;

    // Sent and well formed: kept on every route, in the answer and in the log line.
    let max = format!("gw-{}", "7".repeat(124));
    let cases = [
        (
            "POST",
            "/v1/systemone",
            "gw-1f3a:req.42_A~!",
            triage(),
            200,
            "systemone",
        ),
        (
            "POST",
            "/v1/systemone",
            &max,
            r#"{"model":"m"}"#.to_string(),
            422,
            "systemone",
        ),
        (
            "POST",
            hosted,
            "4b8e-cf-ray",
            hosted_body.to_string(),
            200,
            "workers_ai",
        ),
        (
            "GET",
            "/v1/models",
            "models-id",
            String::new(),
            200,
            "models",
        ),
        (
            "GET",
            "/v2/nothing",
            "lost-id",
            String::new(),
            404,
            "refused",
        ),
    ];
    for (method, path, id, body, status, line) in &cases {
        let r = call(method, path, Some(id), body);
        assert_eq!(r.status().as_u16(), *status, "{method} {path}");
        assert_eq!(&answer_id(&r), id, "{method} {path}");
        assert!(
            log_has(
                &log,
                &[line, &format!("id={id}"), &format!("status={status}")]
            ),
            "{method} {path}: {id} not logged\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let r = call("GET", "/health", Some("health-id"), "");
    assert_eq!(answer_id(&r), "health-id");

    // Malformed (a space, too long, a tab, a byte past ASCII) or absent: the server's own id,
    // answered and logged.
    let long = "x".repeat(129);
    for sent in [
        Some("has space"),
        Some(long.as_str()),
        Some("a\tb"),
        Some("caf\u{e9}"),
        None,
    ] {
        for (path, body) in [
            ("/v1/systemone", triage()),
            (hosted, hosted_body.to_string()),
        ] {
            let r = call("POST", path, sent, &body);
            assert_eq!(r.status().as_u16(), 200, "{path}");
            let id = answer_id(&r);
            assert!(server_made(&id), "{sent:?} -> {id}");
            assert!(log_has(&log, &[&format!("id={id}")]), "{id} not logged");
        }
    }

    // Two ids: neither is the request's.
    let r = agent()
        .post(&format!("{base}/v1/systemone"))
        .header("content-type", "application/json")
        .header("x-request-id", "first")
        .header("x-request-id", "second")
        .send(triage().as_bytes())
        .unwrap();
    assert!(server_made(&answer_id(&r)), "{}", answer_id(&r));

    // The worker's lines name the request too: one whose client leaves while it waits
    // (abandoned), one whose client leaves while it runs (cancelled, between prefill chunks).
    let long_body = format!(
        r#"{{"model":"m","state":"{}","questions":{{"q":{{"type":"noul"}}}}}}"#,
        "slow text ".repeat(6000)
    );
    let impatient: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(400)))
        .build()
        .into();
    let send_impatient = |id: &str, body: &str| {
        let r = impatient
            .post(&format!("{base}/v1/systemone"))
            .header("content-type", "application/json")
            .header("x-request-id", id)
            .send(body.as_bytes());
        assert!(r.is_err(), "{id}: the client was expected to time out");
    };
    let busy = {
        let (base, long_body) = (base.clone(), long_body.clone());
        std::thread::spawn(move || {
            agent()
                .post(&format!("{base}/v1/systemone"))
                .header("content-type", "application/json")
                .send(long_body.as_bytes())
                .unwrap()
                .status()
                .as_u16()
        })
    };
    std::thread::sleep(Duration::from_millis(150));
    send_impatient("left-while-queued", &triage());
    assert_eq!(busy.join().unwrap(), 200);
    assert!(log_has(&log, &["abandoned", "id=left-while-queued"]));
    // Another state: the first is in the prefix cache now.
    send_impatient("left-while-running", &long_body.replace("slow", "late"));
    assert!(
        log_has(&log, &["cancelled", "id=left-while-running"]),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let (_, metrics) = get(&base, "/metrics");
    let count = |name: &str| metric_value(&metrics, name).unwrap_or(0.0);
    assert_eq!(count("clef_abandoned_total "), 1.0, "{metrics}");
    assert_eq!(count("clef_cancelled_total "), 1.0, "{metrics}");
    let _ = std::fs::remove_dir_all(&dir);
}
