//! The front's door to the network: the listener it was given, the accept
//! loop (each connection admitted by `door.rs` or closed), TLS, and one
//! connection's HTTP/1.1 service.

use std::convert::Infallible;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Shared;
use super::requests::handle;
use crate::door;

/// How long the headers (hyper) may take to arrive.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The TLS configuration from PEM texts (ring provider, TLS 1.2 and 1.3).
pub fn tls_acceptor(cert: &str, key: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the certificate is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the certificate file".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("the key is not a PEM private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("certificate and key do not fit: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

pub(super) enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// The listening socket the launcher bound (`unix`: a Unix socket),
    /// made non-blocking for the runtime.
    pub(super) fn new(fd: OwnedFd, unix: bool) -> std::io::Result<Listener> {
        if unix {
            let l = std::os::unix::net::UnixListener::from(fd);
            l.set_nonblocking(true)?;
            Ok(Listener::Unix(tokio::net::UnixListener::from_std(l)?))
        } else {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            Ok(Listener::Tcp(tokio::net::TcpListener::from_std(l)?))
        }
    }
}

/// Accept connections until the front shuts down; each one the door admits
/// is served on its own task.
pub(super) async fn accept_loop(shared: Arc<Shared>, listener: Listener, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            a = accept(&listener) => a,
        };
        let (io, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "serve-http: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admitted = shared.door.admit(&peer.group);
        shared.door.report();
        let Some(admitted) = admitted else {
            // Every place is held by connections with a valid token.
            drop(io);
            continue;
        };
        tokio::spawn(admitted_connection(shared.clone(), io, peer, tls.clone(), admitted));
    }
}

/// One admitted connection, TLS handshake included, until it ends, the
/// door closes it, or it stays pending too long.
async fn admitted_connection(
    shared: Arc<Shared>,
    io: Accepted,
    peer: Peer,
    tls: Option<tokio_rustls::TlsAcceptor>,
    admitted: door::Admitted,
) {
    let door::Admitted { id, authenticated, close } = admitted;
    let serve = async {
        match (io, tls) {
            (Accepted::Tcp(s), Some(tls)) => match tls.accept(s).await {
                Ok(s) => connection(shared.clone(), s, peer, authenticated.clone()).await,
                Err(_) => tracing::debug!("serve-http: TLS handshake failed"),
            },
            (Accepted::Tcp(s), None) => connection(shared.clone(), s, peer, authenticated.clone()).await,
            (Accepted::Unix(s), _) => connection(shared.clone(), s, peer, authenticated.clone()).await,
        }
    };
    // A connection without a valid token yet (TLS handshake
    // included) is closed soon, and sooner when its place is needed.
    let pending_expires = async {
        tokio::time::sleep(door::PENDING_LIFETIME).await;
        if authenticated.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = serve => {}
        () = close.cancelled() => {}
        () = pending_expires => {}
    }
    shared.door.left(id);
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Who is at the other end of a connection.
struct Peer {
    /// The full peer address (`ip:port`, or a Unix client's credentials).
    peer: String,
    /// The client host (`ip`, or `unix:uid=N`): modern requests of one
    /// token from one host share a tree.
    host: String,
    /// What the connection counts against at the door (`door::peer_of`).
    group: String,
}

/// A connection and its peer.
async fn accept(l: &Listener) -> std::io::Result<(Accepted, Peer)> {
    match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, a)| {
            (Accepted::Tcp(s), Peer { peer: a.to_string(), host: a.ip().to_string(), group: door::peer_of(&a) })
        }),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| {
            let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials).ok();
            let peer = cred.map(|c| format!("unix:uid={},pid={}", c.uid(), c.pid())).unwrap_or_else(|| "unix".into());
            let host = cred.map(|c| format!("unix:uid={}", c.uid())).unwrap_or_else(|| "unix".into());
            (Accepted::Unix(s), Peer { peer, group: host.clone(), host })
        }),
    }
}

/// One client connection.
pub(super) struct Conn {
    /// The full peer address (`ip:port`, or a Unix client's credentials).
    pub(super) peer: String,
    /// The client host (`ip`, or `unix:uid=N`): modern requests of one
    /// token from one host share a tree.
    pub(super) host: String,
    /// Set once one of its requests presents a valid token (see `door.rs`).
    pub(super) authenticated: Arc<AtomicBool>,
}

async fn connection<IO>(shared: Arc<Shared>, io: IO, peer: Peer, authenticated: Arc<AtomicBool>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = Arc::new(Conn { peer: peer.peer, host: peer.host, authenticated });
    let svc_shared = shared.clone();
    let svc_conn = conn.clone();
    let svc = hyper::service::service_fn(move |req| {
        let shared = svc_shared.clone();
        let conn = svc_conn.clone();
        async move { Ok::<_, Infallible>(handle(shared, conn, req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // max_buf_size bounds hyper's read buffer, which a read can overshoot
    // (a 114 KB header got through); max_header_size is the exact limit on
    // the request line and headers together.
    builder
        .max_buf_size(64 * 1024)
        .max_header_size(64 * 1024)
        .max_headers(64)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    // A request whose connection closes is dropped with it: its guard
    // cancels it (modern) or leaves it to finish (legacy).
    // A client that takes no data for a minute loses the connection, and
    // what was queued for it (see `stall.rs`).
    let io = crate::stall::Stalled::new(io, crate::stall::WRITE_STALL);
    let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc).await;
}
