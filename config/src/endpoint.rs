//! One parsed form of a server address (`SNOWLUMA_MCP_ENDPOINT`,
//! `SNOWLUMA_MCP_EVENTS_URL`): scheme, host, port, path. Every check and
//! every use (validation, the executor's port grant, name resolution before
//! confinement) goes through it, so they cannot disagree.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
    Ws,
    Wss,
}

impl Scheme {
    fn parse(s: &str) -> Option<Scheme> {
        match s.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            "ws" => Some(Scheme::Ws),
            "wss" => Some(Scheme::Wss),
            _ => None,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http | Scheme::Ws => 80,
            Scheme::Https | Scheme::Wss => 443,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: Scheme,
    /// Without the brackets of an IPv6 literal.
    pub host: String,
    pub port: u16,
    /// The path, without query or fragment.
    pub path: String,
    /// Whether a query or fragment followed the path (never shown).
    pub has_query: bool,
    /// The address exactly as configured (it may hold a query with a
    /// token: never shown, never logged).
    pub raw: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("must start with {0}")]
    Scheme(&'static str),
    #[error("has no host")]
    NoHost,
    #[error("must not embed credentials; use SNOWLUMA_MCP_TOKEN")]
    Credentials,
    #[error("contains whitespace or control characters")]
    Whitespace,
    #[error("has a port that is not a number from 1 to 65535")]
    Port,
    #[error("must not contain a query or fragment")]
    Query,
}

impl Endpoint {
    /// Parse `raw`, accepting only `schemes` (`expected` names them for the
    /// error message).
    pub fn parse(raw: &str, schemes: &[Scheme], expected: &'static str) -> Result<Endpoint, EndpointError> {
        let (scheme, rest) = raw.split_once("://").ok_or(EndpointError::Scheme(expected))?;
        let scheme = Scheme::parse(scheme).filter(|s| schemes.contains(s)).ok_or(EndpointError::Scheme(expected))?;
        if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(EndpointError::Whitespace);
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if authority.contains('@') {
            return Err(EndpointError::Credentials);
        }
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (h, after) = v6.split_once(']').ok_or(EndpointError::NoHost)?;
                match after {
                    "" => (h, None),
                    p => (h, Some(p.strip_prefix(':').ok_or(EndpointError::Port)?)),
                }
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            },
        };
        if host.is_empty() {
            return Err(EndpointError::NoHost);
        }
        let port = match port {
            None => scheme.default_port(),
            Some(p) => match p.parse::<u32>() {
                Ok(n @ 1..=65535) => n as u16,
                _ => return Err(EndpointError::Port),
            },
        };
        let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
        Ok(Endpoint {
            scheme,
            host: host.to_owned(),
            port,
            path: tail[..path_end].to_owned(),
            has_query: path_end < tail.len(),
            raw: raw.to_owned(),
        })
    }

    pub fn is_ip_literal(&self) -> bool {
        self.host.parse::<std::net::IpAddr>().is_ok()
    }
}

/// How a value that did not parse may be shown: up to its first `?` or
/// `#`, and nothing at all if it may embed credentials.
pub fn shown_raw(raw: &str) -> String {
    if raw.contains('@') {
        return "<redacted>".to_owned();
    }
    let cut = raw.find(['?', '#']).unwrap_or(raw.len());
    let more = if cut < raw.len() { "?…" } else { "" };
    format!("{:?}", format!("{}{more}", &raw[..cut]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP: &[Scheme] = &[Scheme::Http, Scheme::Https];
    const WS: &[Scheme] = &[Scheme::Ws, Scheme::Wss];

    fn http(raw: &str) -> Result<Endpoint, EndpointError> {
        Endpoint::parse(raw, HTTP, "http:// or https://")
    }

    #[test]
    fn parses_hosts_ports_and_paths() {
        let e = http("http://127.0.0.1:3000/").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("127.0.0.1", 3000, "/"));
        assert!(e.is_ip_literal());
        assert_eq!(http("https://example.org").unwrap().port, 443);
        assert_eq!(http("HTTP://example.org/x").unwrap().port, 80);
        let v6 = http("http://[::1]:5700/onebot").unwrap();
        assert_eq!((v6.host.as_str(), v6.port, v6.path.as_str()), ("::1", 5700, "/onebot"));
        assert_eq!(http("http://[::1]/").unwrap().port, 80);
        assert_eq!(Endpoint::parse("wss://h:8443/ws", WS, "ws").unwrap().port, 8443);
    }

    #[test]
    fn refuses_what_cannot_be_an_endpoint() {
        assert_eq!(http("http://127.0.0.1:99999/"), Err(EndpointError::Port));
        assert_eq!(http("http://127.0.0.1:0/"), Err(EndpointError::Port));
        assert_eq!(http("http://127.0.0.1:x/"), Err(EndpointError::Port));
        assert_eq!(http("http://[::1]x/"), Err(EndpointError::Port));
        assert_eq!(http("http://u:p@h/"), Err(EndpointError::Credentials));
        assert_eq!(http("http:///x"), Err(EndpointError::NoHost));
        assert_eq!(http("ftp://h/"), Err(EndpointError::Scheme("http:// or https://")));
        assert_eq!(http("ws://h/"), Err(EndpointError::Scheme("http:// or https://")));
        assert_eq!(http("http://h /"), Err(EndpointError::Whitespace));
    }

    #[test]
    fn never_shows_a_query() {
        let e = http("http://127.0.0.1:3000/?access_token=s3cret").unwrap();
        assert!(e.has_query);
        assert_eq!(e.path, "/");
        assert!(!shown_raw("http://h:99999/?access_token=s3cret").contains("s3cret"));
        assert_eq!(shown_raw("http://u:p@h/"), "<redacted>");
    }
}
