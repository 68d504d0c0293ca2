//! Remote images: `http(s)://` URLs in `images` or video frames, fetched only when
//! `CLEF_ALLOW_REMOTE_IMAGES=1`. A guard against server-side request forgery: the host is
//! resolved and every address must be public (no loopback, private, link-local, shared,
//! multicast, unspecified or reserved ranges, IPv4-mapped IPv6 included); the connection can
//! only go to the addresses the guarded resolver let through, so a DNS answer that changes
//! between the check and the connect cannot reach an internal host; redirects are followed by
//! hand, at most 3, each re-checked; 10 s for the whole fetch; the same byte cap as an inline
//! image.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// Redirects followed per image.
const MAX_REDIRECTS: usize = 3;
/// Time for one image, redirects included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether remote URLs are fetched, and addresses allowed although not public (for tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteImages {
    pub enabled: bool,
    pub allow: Vec<IpAddr>,
}

impl RemoteImages {
    fn allowed(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.allow.contains(&ip)
    }
}

/// A globally routable unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => is_public_v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(a),
        },
    }
}

fn is_public_v4(a: Ipv4Addr) -> bool {
    let [b0, b1, b2, _] = a.octets();
    !(a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_multicast()
        || a.is_broadcast()
        || a.is_unspecified()
        || a.is_documentation()
        || b0 == 0
        || (b0 == 100 && (64..128).contains(&b1)) // shared address space
        || (b0 == 192 && b1 == 0 && b2 == 0) // IETF protocol assignments
        || (b0 == 198 && (18..20).contains(&b1)) // benchmarking
        || b0 >= 240) // reserved
}

fn is_public_v6(a: Ipv6Addr) -> bool {
    let s0 = a.segments()[0];
    !(a.is_loopback()
        || a.is_unspecified()
        || a.is_multicast()
        || (s0 & 0xfe00) == 0xfc00 // unique local
        || (s0 & 0xffc0) == 0xfe80 // link-local
        || (s0 == 0x2001 && a.segments()[1] == 0x0db8)) // documentation
}

/// The default resolver, keeping only allowed addresses.
#[derive(Debug)]
struct GuardedResolver {
    policy: RemoteImages,
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let found = DefaultResolver::default().resolve(uri, config, timeout)?;
        let mut kept = self.empty();
        for addr in found.iter().filter(|a| self.policy.allowed(a.ip())) {
            kept.push(*addr);
        }
        if kept.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(kept)
    }
}

/// Why a remote image was not fetched.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RemoteError {
    #[error("remote image URLs are off (CLEF_ALLOW_REMOTE_IMAGES=1 turns them on)")]
    Disabled,
    #[error("{0}")]
    Refused(String),
    #[error("fetching the image failed: {0}")]
    Fetch(String),
}

/// Every address of the URL's host, refused unless all are allowed (the clear message; the
/// guarded resolver enforces it again at connect time).
fn check_host(url: &ureq::http::Uri, policy: &RemoteImages) -> Result<(), RemoteError> {
    let scheme = url.scheme_str().unwrap_or("");
    if scheme != "http" && scheme != "https" {
        return Err(RemoteError::Refused(format!(
            "{scheme:?} URLs are not fetched"
        )));
    }
    let host = url
        .host()
        .ok_or_else(|| RemoteError::Refused("the URL has no host".into()))?;
    let port = url
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| RemoteError::Fetch(format!("{host}: {e}")))?
        .collect();
    match addrs.iter().find(|a| !policy.allowed(a.ip())) {
        Some(a) => Err(RemoteError::Refused(format!(
            "{host} resolves to {}, which is not a public address",
            a.ip()
        ))),
        None if addrs.is_empty() => Err(RemoteError::Fetch(format!("{host}: no address"))),
        None => Ok(()),
    }
}

/// Fetch `url` under `policy`, reading at most `max_bytes`.
pub fn fetch(url: &str, policy: &RemoteImages, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
    if !policy.enabled {
        return Err(RemoteError::Disabled);
    }
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(FETCH_TIMEOUT))
        .max_redirects(0)
        .http_status_as_error(false)
        .build();
    let agent = ureq::Agent::with_parts(
        config,
        DefaultConnector::default(),
        GuardedResolver {
            policy: policy.clone(),
        },
    );
    let mut current: ureq::http::Uri = url
        .parse()
        .map_err(|e| RemoteError::Refused(format!("not a URL: {e}")))?;
    for _ in 0..=MAX_REDIRECTS {
        check_host(&current, policy)?;
        let mut resp = agent
            .get(&current)
            .call()
            .map_err(|e| RemoteError::Fetch(e.to_string()))?;
        let status = resp.status();
        if status.is_redirection() {
            let location = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| RemoteError::Fetch(format!("{status} without a location")))?;
            current = resolve_location(&current, location)?;
            continue;
        }
        if !status.is_success() {
            return Err(RemoteError::Fetch(format!("the server answered {status}")));
        }
        return resp
            .body_mut()
            .with_config()
            .limit(max_bytes as u64)
            .read_to_vec()
            .map_err(|e| RemoteError::Fetch(e.to_string()));
    }
    Err(RemoteError::Refused(format!(
        "more than {MAX_REDIRECTS} redirects"
    )))
}

/// A redirect target: absolute, or a path on the same origin.
fn resolve_location(
    base: &ureq::http::Uri,
    location: &str,
) -> Result<ureq::http::Uri, RemoteError> {
    let target = if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else if location.starts_with('/') {
        format!(
            "{}://{}{location}",
            base.scheme_str().unwrap_or("http"),
            base.authority().map(|a| a.as_str()).unwrap_or("")
        )
    } else {
        return Err(RemoteError::Refused(format!(
            "unsupported redirect to {location:?}"
        )));
    };
    target
        .parse()
        .map_err(|e| RemoteError::Refused(format!("bad redirect {location:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_pass() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }
}
