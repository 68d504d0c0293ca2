//! The browser demo page (`demo/`), embedded in the binary and served at `/` (HTML) and
//! `/demo/app.js`, `/demo/style.css`. Static and never behind the API key: the page itself asks
//! for the key and sends it with its API calls. `CLEF_DEMO=0` (`serve --demo 0`) turns it off.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../../demo/index.html");
const APP_JS: &str = include_str!("../../demo/app.js");
const STYLE_CSS: &str = include_str!("../../demo/style.css");

/// Only this origin's scripts, styles and API calls; no inline script, no framing.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// The page's routes, to merge into the API router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/demo/app.js",
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/demo/style.css",
            get(|| async { asset(STYLE_CSS, "text/css; charset=utf-8") }),
        )
}
