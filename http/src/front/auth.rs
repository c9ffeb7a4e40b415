//! Who may ask, and whether the request head can be trusted: the framing
//! rules hyper leaves to its server ([`strict_head`]), `Host` and `Origin`
//! against the configured names, and the bearer token (its digest compared
//! with every configured one, in constant time).

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use sha2::Digest;

use super::Shared;
use super::responses::{Body, refuse_head};
use snowluma_proto::front::TokenDigest;

pub(super) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// A list header's value over all its lines (`Accept` may be split).
pub(super) fn header_list(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ")
}

pub(super) fn host_ok(shared: &Shared, h: &HeaderMap) -> bool {
    header_str(h, "host").is_some_and(|host| shared.allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(host.trim())))
}

pub(super) fn origin_ok(shared: &Shared, h: &HeaderMap) -> bool {
    match h.get(header::ORIGIN) {
        None => true,
        Some(v) => v.to_str().is_ok_and(|o| {
            let o = o.trim().trim_end_matches('/');
            shared.allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(o))
        }),
    }
}

/// Constant-time equality of two digests.
fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for i in 0..32 {
        diff |= std::hint::black_box(a[i] ^ b[i]);
    }
    std::hint::black_box(diff) == 0
}

/// The token the request presents (its id and digest), comparing its digest
/// with every configured one (no early exit).
pub(super) fn authenticate(shared: &Shared, h: &HeaderMap) -> Option<TokenDigest> {
    let value = header_str(h, "authorization")?;
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let digest: [u8; 32] = sha2::Sha256::digest(token.trim().as_bytes()).into();
    let tokens = shared.tokens.lock().ok()?;
    let mut found = None;
    for t in tokens.iter() {
        if digest_eq(&t.sha256, &digest) {
            found = Some(t.clone());
        }
    }
    found
}

/// Whether `token` (id and digest) is still in the configured set.
pub(super) fn still_valid(shared: &Shared, token: &TokenDigest) -> bool {
    shared.tokens.lock().is_ok_and(|t| t.iter().any(|x| x.id == token.id && digest_eq(&x.sha256, &token.sha256)))
}

/// Header fields a request may carry at most once: which of two lines a
/// reader takes would decide who the request is from or what it is.
const SINGLE: [&str; 7] = [
    "authorization",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
];

/// What RFC 9112 requires and hyper leaves to its server: exactly one valid
/// `Host` (§3.2; with an absolute-form target, the same authority), and
/// `Transfer-Encoding` only as one `chunked` (§6.1: chunked applied twice,
/// or another coding, is not a body we can frame). `Origin` and the fields
/// that name the principal or the request appear at most once.
pub(super) fn strict_head(req: &Request<Incoming>) -> Result<(), Response<Body>> {
    let h = req.headers();
    let mut hosts = h.get_all(header::HOST).iter();
    let host = match (hosts.next().map(HeaderValue::to_str), hosts.next()) {
        (Some(Ok(host)), None) if !host.trim().is_empty() => host.trim(),
        (None, _) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: the Host header is missing")),
        (_, Some(_)) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: more than one Host header")),
        (Some(_), None) => return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: an invalid Host header")),
    };
    if let Some(authority) = req.uri().authority()
        && !authority.as_str().eq_ignore_ascii_case(host)
    {
        return Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: the request target names another host"));
    }
    if h.get_all(header::ORIGIN).iter().nth(1).is_some() {
        return Err(refuse_head(StatusCode::FORBIDDEN, "Forbidden: more than one Origin header"));
    }
    if let Some(name) = SINGLE.iter().find(|n| h.get_all(**n).iter().nth(1).is_some()) {
        return Err(refuse_head(StatusCode::BAD_REQUEST, &format!("Bad Request: more than one {name} header")));
    }
    let mut codings = h.get_all(header::TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(te), None) if te.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("chunked")) => Ok(()),
        _ => Err(refuse_head(StatusCode::BAD_REQUEST, "Bad Request: Transfer-Encoding other than one chunked coding")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_compare_whole() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(digest_eq(&a, &b));
        b[31] ^= 1;
        assert!(!digest_eq(&a, &b));
        b = a;
        b[0] ^= 0x80;
        assert!(!digest_eq(&a, &b));
    }
}
