//! Refusals every client can read (`src/api/drain.rs`), on `clef-tt serve` as a process:
//!
//! - over raw TCP as Python's clients send (the whole body, then read): a 64 MiB body with a
//!   `Content-Length` and a chunked one get the 413 and its JSON body on both decision routes,
//!   and the connection then answers the next request; 401 (no key) and 415 likewise;
//! - `Expect: 100-continue` gets the 413 at once, without a `100 Continue`;
//! - a 1 GiB body (a `Content-Length` past the drain bound, and chunked) is cut off, and the
//!   server's resident memory meanwhile stays within what a 1 MiB request needs;
//! - Python's `urllib`, `requests`, `httpx` and the official SDK read every refusal
//!   (`tests/clients/oversize_bodies.py`): with `python3` (urllib alone where the others are not
//!   installed) or `CLEF_SDK_PYTHON` (`.ci/run`'s venv, with all four).

mod common;

use common::process::{resident_kib, spawn_server};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SYSTEMONE: &str = "/v1/systemone";
const WORKERS_AI: &str = "/client/v4/accounts/acct/ai/run/@cf/cloudflare/clef";
const MIB: usize = 1 << 20;

fn small_request() -> Vec<u8> {
    br#"{"model":"clef","state":"Orders are blocked.","questions":{"q":{"type":"noul","instructions":"Is a service down?"}}}"#.to_vec()
}

/// A body of `n` bytes, sent as it is (never parsed: it is refused before).
fn filler(n: usize) -> Vec<u8> {
    b"word ".iter().copied().cycle().take(n).collect()
}

fn connect(base: &str) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// A response: status, headers (lower-case names), body.
type Reply = (u16, Vec<(String, String)>, String);

/// One response off `r`.
fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<Reply> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// Sends a request whose body is `body` (chunked in 1 MiB pieces when `chunked`), all of it
/// before reading, as urllib does.
fn send(
    s: &mut TcpStream,
    path: &str,
    extra: &str,
    body: &[u8],
    chunked: bool,
) -> std::io::Result<()> {
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{extra}{framing}\r\n\r\n"
    )?;
    if chunked {
        for piece in body.chunks(MIB) {
            write!(s, "{:x}\r\n", piece.len())?;
            s.write_all(piece)?;
            s.write_all(b"\r\n")?;
        }
        s.write_all(b"0\r\n\r\n")?;
    } else {
        s.write_all(body)?;
    }
    s.flush()
}

fn assert_refusal(path: &str, got: &Reply, status: u16) {
    assert_eq!(got.0, status, "{path}: {}", got.2);
    let v: Value = serde_json::from_str(&got.2).unwrap();
    if path == WORKERS_AI {
        assert_eq!(v["success"], false, "{v}");
        assert!(v["errors"][0]["message"].is_string(), "{v}");
    } else {
        assert!(v["error"]["message"].is_string(), "{v}");
    }
}

#[test]
fn refusals_before_the_body_reach_clients_that_send_it_all_first() {
    let (_server, base, _) = spawn_server(&["--warmup", "0"], &[("CLEF_API_KEY", "k")]);
    let body = filler(64 * MIB);
    for path in [SYSTEMONE, WORKERS_AI] {
        for chunked in [false, true] {
            let mut s = connect(&base);
            send(&mut s, path, "Authorization: Bearer k\r\n", &body, chunked).unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let got = read_response(&mut r).unwrap();
            assert_refusal(path, &got, 413);
            // Drained to its end: the connection stays open and answers the next request.
            send(
                &mut s,
                path,
                "Authorization: Bearer k\r\n",
                &small_request(),
                false,
            )
            .unwrap();
            let next = read_response(&mut r).unwrap();
            assert_eq!(next.0, 200, "{path} after a drained 413: {}", next.2);
        }
        // No key (401) and another content type (415): refused before the body too.
        let mut s = connect(&base);
        send(&mut s, path, "", &filler(8 * MIB), false).unwrap();
        assert_refusal(path, &read_response(&mut BufReader::new(s)).unwrap(), 401);
        let mut s = connect(&base);
        let text = format!(
            "POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer k\r\n\
             Content-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
            8 * MIB
        );
        s.write_all(text.as_bytes()).unwrap();
        s.write_all(&filler(8 * MIB)).unwrap();
        assert_refusal(path, &read_response(&mut BufReader::new(s)).unwrap(), 415);
    }
    // Expect: 100-continue: the 413 comes at once, no 100 Continue, and no body is wanted.
    let mut s = connect(&base);
    write!(
        s,
        "POST {SYSTEMONE} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer k\r\n\
         Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        64 * MIB
    )
    .unwrap();
    let got = read_response(&mut BufReader::new(s)).unwrap();
    assert_refusal(SYSTEMONE, &got, 413);
}

/// The largest resident size of `pid` sampled every 5 ms while `work` runs.
fn peak_resident_kib(pid: u32, work: impl FnOnce()) -> u64 {
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = resident_kib(&pid.to_string());
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(resident_kib(&pid.to_string()));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.max(resident_kib(&pid.to_string()))
        })
    };
    work();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap()
}

#[test]
fn a_body_past_the_drain_bound_is_cut_off_with_flat_memory() {
    // A limit of 1 MiB: "what a 1 MiB request needs" is then a request at the limit.
    let (server, base, _) = spawn_server(&["--warmup", "0", "--max-body-bytes", "1048576"], &[]);
    let pid = server.0.id();
    let at_limit = {
        let mut state = filler(MIB - 200);
        let mut b = br#"{"model":"clef","questions":{"q":{"type":"noul"}},"state":""#.to_vec();
        b.append(&mut state);
        b.extend_from_slice(br#""}"#);
        b
    };
    let one_mib = peak_resident_kib(pid, || {
        for _ in 0..3 {
            let mut s = connect(&base);
            send(&mut s, SYSTEMONE, "", &at_limit, false).unwrap();
            let got = read_response(&mut BufReader::new(s)).unwrap();
            assert!(got.0 < 500, "{}", got.2);
        }
    });
    let gib = 1usize << 30;
    let piece = filler(MIB);
    let cut_off = peak_resident_kib(pid, || {
        // A Content-Length past the bound (128 MiB): answered and closed at once.
        let mut s = connect(&base);
        write!(
            s,
            "POST {SYSTEMONE} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             Content-Length: {gib}\r\n\r\n"
        )
        .unwrap();
        let sent = (0..1024)
            .take_while(|_| s.write_all(&piece).is_ok())
            .count();
        assert!(sent < 1024, "all of a 1 GiB body was read");
        // Chunked: drained to the bound, then closed.
        let mut s = connect(&base);
        write!(
            s,
            "POST {SYSTEMONE} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        )
        .unwrap();
        let sent = (0..1024)
            .take_while(|_| {
                write!(s, "{:x}\r\n", piece.len())
                    .and_then(|_| s.write_all(&piece))
                    .and_then(|_| s.write_all(b"\r\n"))
                    .is_ok()
            })
            .count();
        assert!(sent < 1024, "all of a chunked 1 GiB body was read");
        eprintln!("chunked 1 GiB: cut off after {sent} MiB sent");
    });
    eprintln!(
        "resident: {one_mib} KiB at most over three 1 MiB requests, {cut_off} KiB at most over \
         two 1 GiB bodies"
    );
    assert!(
        cut_off <= one_mib + 2048,
        "the 1 GiB bodies took the server to {cut_off} KiB, a 1 MiB request to {one_mib} KiB"
    );
    // Still serving.
    let mut s = connect(&base);
    send(&mut s, SYSTEMONE, "", &small_request(), false).unwrap();
    assert_eq!(read_response(&mut BufReader::new(s)).unwrap().0, 200);
}

/// `CLEF_SDK_PYTHON`, else `python3`.
fn python() -> PathBuf {
    std::env::var_os("CLEF_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "python3".into())
}

#[test]
fn python_clients_read_every_refusal() {
    let (_server, base, _) = spawn_server(&["--warmup", "0"], &[("CLEF_API_KEY", "k")]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/oversize_bodies.py");
    let out = match Command::new(python())
        .arg(script)
        .args([&base, "--key", "k"])
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var_os("CLEF_SDK_PYTHON").is_none() => {
            eprintln!("SKIPPED: no python3 to run the Python clients ({e})");
            return;
        }
        Err(e) => panic!("CLEF_SDK_PYTHON does not run: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    if std::env::var_os("CLEF_SDK_PYTHON").is_some() {
        assert!(
            !text.contains("skipped"),
            "CLEF_SDK_PYTHON lacks a client:\n{text}"
        );
    }
}
