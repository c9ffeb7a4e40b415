//! The session trees' lifecycle: a token's session places (the least
//! recently used quiet tree makes room), starting a tree through the
//! launcher, ending one, the control loop that takes the launcher's
//! messages, and the reaper of idle and ended trees.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{Response, StatusCode};
use serde_json::Value;
use tokio::sync::oneshot;

use super::Shared;
use super::auth::still_valid;
use super::responses::{Body, empty, rpc_error, too_many, unauthorized};
use crate::relay::Tree;
use snowluma_proto::front::{ToFront, ToLauncher, TokenDigest};

/// How long the launcher may take to start a tree.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Who waits for the launcher's answer to a spawn: the session number and
/// its socket, or `None` if it failed; and the token the tree is for.
pub(super) type SpawnWaiter = (oneshot::Sender<Option<(u64, OwnedFd)>>, TokenDigest);

/// Take one of the token's session places. At the limit, the token's
/// least recently used *quiet* tree (nothing in flight, no stream open) is
/// ended to make room: many clients never send DELETE when they exit, and
/// their sessions would otherwise hold every place until they expire. Its
/// client, if it comes back, gets 404 and starts a new session, as the
/// transport prescribes. Only when every tree of the token is busy is the
/// answer 429.
async fn take_place(shared: &Arc<Shared>, token_id: &str) -> Result<(), Response<Body>> {
    if try_take_place(shared, token_id)? {
        return Ok(());
    }
    let quietest = shared.trees.lock().ok().and_then(|t| {
        t.iter()
            .filter(|x| x.token_id == token_id && !x.ended.is_cancelled())
            .filter_map(|x| x.quiet_since().map(|since| (since, x.clone())))
            .min_by_key(|(since, _)| *since)
            .map(|(_, x)| x)
    });
    if let Some(tree) = quietest {
        tracing::info!(
            session = tree.session,
            token_id,
            "serve-http: session limit reached; ending the least recently used quiet session"
        );
        end_tree(shared, &tree).await;
        if try_take_place(shared, token_id)? {
            return Ok(());
        }
    }
    Err(too_many("Too many sessions for this token"))
}

/// One of the token's places, if one is free.
fn try_take_place(shared: &Shared, token_id: &str) -> Result<bool, Response<Body>> {
    let mut usage = shared.usage.lock().map_err(|_| empty(StatusCode::INTERNAL_SERVER_ERROR))?;
    let u = usage.entry(token_id.to_owned()).or_default();
    if u.sessions >= shared.max_sessions {
        return Ok(false);
    }
    u.sessions += 1;
    Ok(true)
}

pub(super) async fn spawn_tree(
    shared: &Arc<Shared>,
    token: &TokenDigest,
    peer: &str,
) -> Result<Arc<Tree>, Response<Body>> {
    let token_id = token.id.as_str();
    take_place(shared, token_id).await?;
    let release = || {
        if let Ok(mut u) = shared.usage.lock()
            && let Some(u) = u.get_mut(token_id)
        {
            u.sessions = u.sessions.saturating_sub(1);
        }
    };
    let req = shared.next_req.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    if let Ok(mut s) = shared.spawns.lock() {
        s.insert(req, (tx, token.clone()));
    }
    let msg = ToLauncher::Spawn { req, token_id: token_id.to_owned(), peer: peer.to_owned() };
    let got = match shared.control.send(&msg, None).await {
        Ok(()) => tokio::time::timeout(SPAWN_TIMEOUT, rx).await.ok().and_then(Result::ok).flatten(),
        Err(_) => None,
    };
    let Some((session, fd)) = got else {
        if let Ok(mut s) = shared.spawns.lock() {
            s.remove(&req);
        }
        release();
        return Err(rpc_error(StatusCode::SERVICE_UNAVAILABLE, Value::Null, -32603, "Cannot start a session"));
    };
    let stream = std::os::unix::net::UnixStream::from(fd);
    let stream =
        stream.set_nonblocking(true).and_then(|()| tokio::net::UnixStream::from_std(stream)).map_err(|_| {
            release();
            rpc_error(StatusCode::SERVICE_UNAVAILABLE, Value::Null, -32603, "Cannot start a session")
        })?;
    let tree = Tree::start(session, token_id.to_owned(), token.sha256, stream, shared.response_budget.clone());
    if let Ok(mut t) = shared.trees.lock() {
        t.push(tree.clone());
    }
    // A revocation (SIGHUP) may have come while the launcher started this
    // tree: its handler changes the token set first and then ends the trees
    // it finds, and this tree is registered before the set is read here, so
    // either that handler ended it or this check sees the new set.
    if !still_valid(shared, token) {
        tracing::info!(session = tree.session, token_id, "serve-http: the token was revoked while its session started");
        end_tree_as(shared, &tree, true).await;
        return Err(unauthorized());
    }
    Ok(tree)
}

/// Let a tree go (once): cancel its calls, close its stdin, tell the
/// launcher, release its place.
pub(super) async fn end_tree(shared: &Arc<Shared>, tree: &Arc<Tree>) {
    end_tree_as(shared, tree, false).await;
}

/// [`end_tree`]; `revoked`: its token was revoked, so the launcher kills
/// what is left of it after a short grace, background transfers included.
async fn end_tree_as(shared: &Arc<Shared>, tree: &Arc<Tree>, revoked: bool) {
    let was_live = shared
        .trees
        .lock()
        .map(|mut t| {
            let before = t.len();
            t.retain(|x| !Arc::ptr_eq(x, tree));
            t.len() != before
        })
        .unwrap_or(false);
    if let Ok(mut s) = shared.sessions.lock() {
        s.retain(|_, x| !Arc::ptr_eq(x, tree));
    }
    // (The modern map is not touched here: a spawn may hold it while it
    // waits for the launcher, whose answer this task may be delivering. An
    // ended tree in it is replaced by the next request.)
    tree.end().await;
    if was_live {
        if let Ok(mut u) = shared.usage.lock()
            && let Some(u) = u.get_mut(&tree.token_id)
        {
            u.sessions = u.sessions.saturating_sub(1);
        }
        let _ = shared.control.send(&ToLauncher::End { session: tree.session, revoked }, None).await;
    }
}

pub(super) async fn control_loop(shared: Arc<Shared>) {
    loop {
        match shared.control.recv().await {
            Ok((ToFront::Spawned { req, session }, Some(fd))) => {
                let waiter = shared.spawns.lock().ok().and_then(|mut s| s.remove(&req));
                // A tree nobody waits for any more (the spawn timed out) is
                // let go at once; killed soon if its token was revoked since.
                let orphan = match waiter {
                    Some((w, token)) => match w.send(Some((session, fd))) {
                        Ok(()) => None,
                        Err(_) => Some(!still_valid(&shared, &token)),
                    },
                    None => Some(false),
                };
                if let Some(revoked) = orphan {
                    let _ = shared.control.send(&ToLauncher::End { session, revoked }, None).await;
                }
            }
            Ok((ToFront::SpawnFailed { req }, _)) | Ok((ToFront::Spawned { req, .. }, None)) => {
                if let Some((w, _)) = shared.spawns.lock().ok().and_then(|mut s| s.remove(&req)) {
                    let _ = w.send(None);
                }
            }
            Ok((ToFront::Tokens(new), _)) => {
                // The new set first, then the trees (see `spawn_tree`): a
                // tree of a token no longer in the set (removed, or its
                // value changed) ends, and is killed after a short grace.
                if let Ok(mut t) = shared.tokens.lock() {
                    *t = new;
                }
                let ending: Vec<Arc<Tree>> = shared
                    .trees
                    .lock()
                    .map(|t| t.iter().cloned().collect::<Vec<_>>())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|x| !still_valid(&shared, &TokenDigest { id: x.token_id.clone(), sha256: x.token_sha256 }))
                    .collect();
                for t in ending {
                    end_tree_as(&shared, &t, true).await;
                }
            }
            Ok((ToFront::Exited { session }, _)) => {
                let tree = shared.trees.lock().ok().and_then(|t| t.iter().find(|x| x.session == session).cloned());
                if let Some(t) = tree {
                    end_tree(&shared, &t).await;
                }
            }
            Ok((ToFront::Setup(_), _)) => {}
            Err(e) => {
                tracing::error!(error = %e, "serve-http: the launcher is gone; the front stops");
                shared.shutdown.cancel();
                return;
            }
        }
    }
}

/// End trees that have been idle too long or whose server ended.
pub(super) async fn reaper(shared: Arc<Shared>) {
    let every = shared.idle.min(Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        // What the door did in a flood is reported after it too.
        shared.door.report();
        let due: Vec<Arc<Tree>> = shared
            .trees
            .lock()
            .map(|t| t.iter().filter(|x| x.ended.is_cancelled() || x.idle_for(shared.idle)).cloned().collect())
            .unwrap_or_default();
        for t in due {
            if !t.ended.is_cancelled() {
                tracing::info!(session = t.session, "serve-http: an idle session expired");
            }
            end_tree(&shared, &t).await;
        }
        // Forget ended modern trees (not while a spawn holds the map).
        if let Ok(mut modern) = shared.modern.try_lock() {
            modern.retain(|_, t| !t.ended.is_cancelled());
        }
    }
}
