//! The `clef-tt` binary as a child process: run a command, or serve on a free loopback port
//! until dropped (SIGTERM), with a client.

use std::process::Command;

pub fn assert_succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The binary, with `--device tt` on the host shim this build made unless `--tt-shim` names
/// another (the ttnn shim next to the binary would be found first otherwise).
/// A loopback port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn clef_tt() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_clef-tt"));
    cmd.env("CLEF_TT_SHIM", clef_tt_abi::HOST_SHIM);
    cmd
}

/// A server child process, stopped with SIGTERM when dropped (also when a test fails).
pub struct Server(pub std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return; // already reaped: its pid may belong to someone else now
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// Waits up to `within` for `server` to exit by itself; its status.
pub fn wait_exit(server: &mut Server, within: std::time::Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not exit within {within:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `clef-tt serve` on a free loopback port with `args`; returns the child, its base URL and
/// a client once /health says ready.
pub fn spawn_server(args: &[&str], env: &[(&str, &str)]) -> (Server, String, ureq::Agent) {
    spawn(args, env, None)
}

/// [`spawn_server`] with the server's stdout and stderr written to `log`.
pub fn spawn_logged(
    args: &[&str],
    env: &[(&str, &str)],
    log: &std::path::Path,
) -> (Server, String, ureq::Agent) {
    spawn(args, env, Some(log))
}

fn spawn(
    args: &[&str],
    env: &[(&str, &str)],
    log: Option<&std::path::Path>,
) -> (Server, String, ureq::Agent) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = clef_tt();
    let (out, err) = match log {
        Some(path) => {
            let file = std::fs::File::create(path).unwrap();
            (file.try_clone().unwrap().into(), file.into())
        }
        None => (std::process::Stdio::null(), std::process::Stdio::null()),
    };
    child
        .args(["serve", "--port", &port.to_string()])
        .args(args)
        .stdout(out)
        .stderr(err);
    for (k, v) in env {
        child.env(k, v);
    }
    let mut child = Server(child.spawn().unwrap());
    let base = format!("http://127.0.0.1:{port}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(900)))
        .build()
        .into();
    let mut up = false;
    // Up to 10 minutes (a mock device builds its programs on first use), unless it exits.
    for _ in 0..12_000 {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("the server exited before it was ready ({status})");
        }
        if agent
            .get(&format!("{base}/health"))
            .call()
            .is_ok_and(|r| r.status() == 200)
        {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(up, "the server did not come up");
    (child, base, agent)
}

/// POST a JSON body to `/v1/systemone`; status and body text.
pub fn post_json(agent: &ureq::Agent, base: &str, body: &[u8]) -> (u16, String) {
    let mut r = agent
        .post(&format!("{base}/v1/systemone"))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// Runs `clef-tt` with `args` (and `env`), which must fail without a panic; its stderr.
pub fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = clef_tt();
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "clef-tt {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// The resident memory of a process (`pid`, or `self`), in KiB (0 if unreadable).
pub fn resident_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}
