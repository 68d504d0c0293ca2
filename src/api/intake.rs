//! A decision request off the wire, for `/v1/systemone` and the Workers AI route alike: the
//! bearer key (401), the byte limit before and after gzip/zstd decoding (413), the content type
//! and encoding (415, 400 for an undecodable body), and JSON (422).

use super::state::ServerSettings;
use crate::request::{parse_body, RequestError};
use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, HeaderMap};
use serde_json::Value;

/// The JSON body of a decision request (the caller checks the key first, [`check_key`]): the
/// byte limit, content type and encoding, then JSON.
pub(super) async fn read_json(
    settings: &ServerSettings,
    request: Request,
) -> Result<Value, RequestError> {
    let (parts, body) = request.into_parts();
    let limit = settings.max_body_bytes;
    let too_large = || {
        RequestError::status(
            413,
            format!("the request body is larger than {limit} bytes"),
            "request_too_large",
        )
    };
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(too_large());
        }
    }
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !(mime == "application/json" || mime.ends_with("+json")) {
            return Err(RequestError::status(
                415,
                format!("Content-Type must be application/json, not {mime:?}"),
                "unsupported_media_type",
            ));
        }
    }
    let encoding = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .unwrap_or_default();
    let bytes = to_bytes(Body::new(body), limit)
        .await
        .map_err(|_| too_large())?;
    // The limit applies after decompression too.
    let bytes = decompress(&encoding, bytes, limit)?;
    parse_body(&bytes)
}

/// Constant-time comparison of the bearer key (no early exit on the first differing byte).
fn key_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = (given.len() ^ expected.len()) as u8;
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(0);
    }
    diff == 0 && given.len() == expected.len()
}

pub(super) fn check_key(
    settings: &ServerSettings,
    headers: &HeaderMap,
) -> Result<(), RequestError> {
    let Some(key) = &settings.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if key_matches(given.trim().as_bytes(), key.as_bytes()) {
        Ok(())
    } else {
        Err(RequestError::status(
            401,
            "missing or invalid API key (Authorization: Bearer <key>)",
            "authentication_error",
        ))
    }
}

/// The body as sent: identity, gzip or zstd (the Python SDK compresses bodies of 1 KiB and
/// more with zstd when it can), at most `limit` bytes once decoded.
fn decompress(
    encoding: &str,
    bytes: axum::body::Bytes,
    limit: usize,
) -> Result<axum::body::Bytes, RequestError> {
    use std::io::Read;
    let bad = |e: String| {
        RequestError::status(
            400,
            format!("the {encoding} body cannot be decoded: {e}"),
            "invalid_body",
        )
    };
    let decoded: Box<dyn Read> = match encoding {
        "" | "identity" => return Ok(bytes),
        "gzip" | "x-gzip" => Box::new(flate2::read::GzDecoder::new(std::io::Cursor::new(bytes))),
        "zstd" => Box::new(
            ruzstd::decoding::StreamingDecoder::new(std::io::Cursor::new(bytes))
                .map_err(|e| bad(e.to_string()))?,
        ),
        other => {
            return Err(RequestError::status(
                415,
                format!("Content-Encoding {other:?} is not supported (gzip, zstd or none)"),
                "unsupported_media_type",
            ))
        }
    };
    let mut out = Vec::new();
    decoded
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(e.to_string()))?;
    if out.len() > limit {
        return Err(RequestError::status(
            413,
            format!("the decoded request body is larger than {limit} bytes"),
            "request_too_large",
        ));
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::key_matches;

    #[test]
    fn key_comparison() {
        assert!(key_matches(b"secret", b"secret"));
        assert!(!key_matches(b"secreT", b"secret"));
        assert!(!key_matches(b"secret1", b"secret"));
        assert!(!key_matches(b"", b"secret"));
    }
}
