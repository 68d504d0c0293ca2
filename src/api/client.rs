//! A blocking HTTP client of a running clef-tt server (`decide --url`, `bench http`):
//! posts bodies to `/v1/systemone` with the API key (`CLEF_API_KEY`) when one is set and the
//! routing key `x-clef-state-key` of each body (`encode::state_key`).

use crate::encode::state_key::{state_key, STATE_KEY_HEADER};
use crate::request::{parse_body, validate};
use std::time::{Duration, Instant};

/// A request that got no reply.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct ClientError {
    /// The request (`POST <url>`) or what failed reading its reply.
    pub what: String,
    pub source: ureq::Error,
}

/// One answered request.
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// `x-clef-prefix-cache` of the reply, if any.
    pub cache: Option<String>,
    /// Client wall clock from send to the last byte, in milliseconds.
    pub wall_ms: f64,
}

pub struct Client {
    agent: ureq::Agent,
    base: String,
    api_key: Option<String>,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8008`).
    pub fn new(base: &str, api_key: Option<String>, timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        Client {
            agent,
            base: base.trim_end_matches('/').to_string(),
            api_key: api_key.filter(|k| !k.is_empty()),
        }
    }

    /// POST `body` to `/v1/systemone`.
    pub fn decide(&self, body: &[u8]) -> Result<Reply, ClientError> {
        let url = format!("{}/v1/systemone", self.base);
        let mut req = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        if let Some(key) = &self.api_key {
            req = req.header("authorization", &format!("Bearer {key}"));
        }
        // The routing key a balancer hashes (deploy/haproxy): the server's digest of the state.
        if let Ok(request) = parse_body(body).and_then(|v| validate(&v, None)) {
            req = req.header(STATE_KEY_HEADER, &state_key(&request));
        }
        let t0 = Instant::now();
        let failed = |what: String| move |source| ClientError { what, source };
        let mut resp = req.send(body).map_err(failed(format!("POST {url}")))?;
        let status = resp.status().as_u16();
        let cache = resp
            .headers()
            .get("x-clef-prefix-cache")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(failed(format!("reading the reply of {url}")))?;
        Ok(Reply {
            status,
            body,
            cache,
            wall_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// GET `path` as text.
    pub fn get(&self, path: &str) -> Result<(u16, String), ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(key) = &self.api_key {
            req = req.header("authorization", &format!("Bearer {key}"));
        }
        let failed = |what: String| move |source| ClientError { what, source };
        let mut resp = req.call().map_err(failed(format!("GET {url}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(failed(format!("reading the reply of {url}")))?;
        Ok((status, text))
    }
}
