//! Refusals every client can read. A route that answers before reading the whole body (413 over
//! the limit, 401 without the key, 415, 404/405 with a body) leaves the rest of the body unread.
//! Closing the connection then makes the kernel reset it while the client is still sending, and
//! clients that send the whole body before reading (Python's `urllib`, `requests`) see a broken
//! pipe instead of the answer. So the layer here reads and discards what the route left, within
//! [`DrainBounds`], before the answer is written, as nginx's lingering close does:
//!
//! - a body drained to its end gets the answer on a connection that stays open;
//! - a body past the byte bound (known from `Content-Length` or counted), or a client slower
//!   than the time bound, gets the answer with `Connection: close` and is cut off, as before;
//! - a client that sent `Expect: 100-continue` has not sent the body: it gets the answer without
//!   a `100 Continue` and sends nothing (curl's way for large bodies).
//!
//! The body is discarded frame by frame, never buffered: memory stays flat at any size.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// How much of a refused body the server reads and discards before answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainBounds {
    /// Bytes read at most after the route answered (the body's whole length for a known
    /// `Content-Length`).
    pub max_bytes: u64,
    /// Time spent reading at most.
    pub max_time: Duration,
}

impl DrainBounds {
    /// The defaults for a body limit: the larger of 4x the limit and 128 MiB, 5 seconds
    /// (128 MiB is ~0.1 s over loopback, ~1 s at 1 Gbit/s).
    pub fn for_limit(max_body_bytes: usize) -> Self {
        DrainBounds {
            max_bytes: (max_body_bytes as u64).saturating_mul(4).max(128 << 20),
            max_time: Duration::from_secs(5),
        }
    }
}

/// The middleware (`axum::middleware::from_fn_with_state`): runs the route, then drains what it
/// left of the body (see the module docs).
pub async fn drain_unread_body(
    State(bounds): State<DrainBounds>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let expects_continue = headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if expects_continue {
        return next.run(request).await;
    }
    let left = Arc::new(Mutex::new(None));
    let (parts, body) = request.into_parts();
    let watched = Body::new(Watched {
        inner: Some(body),
        left: Arc::clone(&left),
    });
    let mut response = next.run(Request::from_parts(parts, watched)).await;
    let rest = left.lock().ok().and_then(|mut slot| slot.take());
    if let Some(rest) = rest {
        let drained = match declared {
            Some(n) if n > bounds.max_bytes => false,
            _ => discard(rest, bounds).await,
        };
        if !drained {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
    response
}

/// Reads and drops `body` within `bounds`; whether it reached its end.
async fn discard(mut body: Body, bounds: DrainBounds) -> bool {
    let read = async {
        let mut seen = 0u64;
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if seen > bounds.max_bytes {
                        return false;
                    }
                }
            }
        }
    };
    tokio::time::timeout(bounds.max_time, read)
        .await
        .unwrap_or(false)
}

/// The request body as the route sees it; what is unread when the route drops it goes to
/// `left`.
struct Watched {
    inner: Option<Body>,
    left: Arc<Mutex<Option<Body>>>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take().filter(|b| !b.is_end_stream()) {
            if let Ok(mut slot) = self.left.lock() {
                *slot = Some(body);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_is_4x_the_limit_or_128_mib() {
        assert_eq!(DrainBounds::for_limit(13 << 20).max_bytes, 128 << 20);
        assert_eq!(DrainBounds::for_limit(64 << 20).max_bytes, 256 << 20);
    }

    #[tokio::test]
    async fn a_body_within_the_bound_is_read_to_its_end() {
        let bounds = DrainBounds {
            max_bytes: 10,
            max_time: Duration::from_secs(1),
        };
        assert!(discard(Body::from(vec![0u8; 10]), bounds).await);
        assert!(!discard(Body::from(vec![0u8; 11]), bounds).await);
    }
}
