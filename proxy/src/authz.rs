//! What the cache serves, it serves only to a caller etcd would allow: [`Authz`] asks
//! etcd once per (token, key range) with the caller's own token, keeps the decision, and
//! drops it when etcd's auth state moves.
//!
//! ## The ask
//! A serializable, count-only Range with limit 1 on the caller's range, with the caller's
//! token: member-local and cheap, and checked by etcd exactly as the caller's own Range
//! (`isOpPermitted`). Identical asks that are in flight together are one ask. An allow
//! for a range covers its sub-ranges; a deny covers only that range. A refusal is kept
//! with etcd's own status (code and message), so a client library's retry and re-auth
//! logic works unchanged. Other failures (etcd unreachable) are not kept.
//!
//! ## How long a decision lives
//! - Until etcd's auth revision moves. etcd >= 3.5 reports it in `AuthStatus`, which the
//!   proxy polls every `--auth-check-interval`; on 3.4, which has no `AuthStatus`, every
//!   decision is re-asked after [`RECHECK_WITHOUT_REVISION`] (2 s) and open watches are
//!   checked every [`WATCH_RECHECK_WITHOUT_REVISION`] (10 s). An auth call forwarded
//!   through the proxy (user, role, permission, enable, disable) drops them at once.
//! - Never longer than half of `--auth-token-ttl` (etcd's token TTL, 300 s by default):
//!   a cached read never touches etcd, so without a bound a token would outlive its TTL.
//!   An ask uses the token as a direct call would, so a token in use stays valid as it
//!   does on etcd, and an unused one expires.
//!
//! When decisions are dropped, the [`epoch`](Authz::epoch) moves: every Watch stream
//! re-checks its cached watches and cancels the ones now refused, with etcd's reason.
//!
//! ## Auth off
//! With etcd's auth off, [`Authz::check`] is one atomic load. The poll is one
//! member-local request per interval, to notice auth being turned on.
//!
//! ## Bounds
//! At most [`MAX_TOKENS`] tokens with at most [`MAX_RANGES_PER_TOKEN`] decisions each are
//! kept (the least recently used token goes first), so distinct tokens cannot exhaust
//! memory, and a repeated token, good or garbage, costs etcd one ask per range and
//! interval, not one per request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};

use crate::pb::etcdserverpb::{AuthStatusRequest, RangeRequest};
use crate::status::is_auth_refusal;
use crate::upstream::{Upstream, TOKEN};

/// Tokens whose decisions are kept at most.
pub(crate) const MAX_TOKENS: usize = 10_000;
/// Decisions kept per token at most (the oldest goes first).
pub(crate) const MAX_RANGES_PER_TOKEN: usize = 64;
/// On etcd without `AuthStatus` (3.4), how long a decision lives.
pub(crate) const RECHECK_WITHOUT_REVISION: Duration = Duration::from_secs(2);
/// On etcd without `AuthStatus` (3.4), how often open cached watches are checked again
/// (each check is one ask per distinct token and range with open watches).
pub(crate) const WATCH_RECHECK_WITHOUT_REVISION: Duration = Duration::from_secs(10);

/// etcd's answer to a caller, as kept.
#[derive(Clone, Debug)]
enum Verdict {
    Allow,
    Deny(Code, String),
}

impl Verdict {
    fn result(&self) -> Result<(), Status> {
        match self {
            Verdict::Allow => Ok(()),
            Verdict::Deny(code, msg) => Err(Status::new(*code, msg.clone())),
        }
    }
}

#[derive(Debug)]
struct Decision {
    key: Bytes,
    end: Bytes,
    verdict: Verdict,
    at: Instant,
}

#[derive(Debug, Default)]
struct TokenDecisions {
    list: Vec<Decision>,
    used: Option<Instant>,
}

type AskKey = (Bytes, Bytes, Bytes);
type Ask = Shared<BoxFuture<'static, Result<Verdict, (Code, String)>>>;

/// The decisions, the asks in flight and etcd's auth state.
pub(crate) struct Authz {
    upstream: Arc<Upstream>,
    decisions: Mutex<HashMap<Bytes, TokenDecisions>>,
    asking: Mutex<HashMap<AskKey, Ask>>,
    /// etcd's auth revision (`AuthStatus`), 0 when unknown.
    revision: AtomicU64,
    max_age: Duration,
    epoch: watch::Sender<u64>,
    /// Moves whenever decisions are dropped: a decision asked for before is not kept.
    generation: AtomicU64,
}

impl Authz {
    /// Decisions living at most half of `token_ttl`.
    pub(crate) fn new(upstream: Arc<Upstream>, token_ttl: Duration) -> Arc<Authz> {
        Arc::new(Authz {
            upstream,
            decisions: Mutex::new(HashMap::new()),
            asking: Mutex::new(HashMap::new()),
            revision: AtomicU64::new(0),
            max_age: (token_ttl / 2).max(Duration::from_millis(100)),
            epoch: watch::channel(0).0,
            generation: AtomicU64::new(0),
        })
    }

    /// Moves when decisions were dropped: cached watches are checked again.
    pub(crate) fn epoch(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// Whether etcd's auth is on (as last learned).
    pub(crate) fn enabled(&self) -> bool {
        self.upstream.auth_enabled()
    }

    /// Forgets every decision (etcd's auth state moved) and tells the Watch streams.
    pub(crate) fn invalidate(&self) {
        self.forget();
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Forgets every decision; the next use of each asks etcd again.
    fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.decisions.lock().clear();
    }

    /// Whether the caller of `metadata` may read `[key, end)` (etcd's keyspace; empty end: one
    /// key, `"\0"`: from key on) as etcd would decide it now.
    ///
    /// # Errors
    /// etcd's refusal, as etcd gave it; or why etcd could not be asked.
    pub(crate) async fn check(
        &self,
        metadata: &MetadataMap,
        key: &[u8],
        end: &[u8],
    ) -> Result<(), Status> {
        if !self.enabled() {
            return Ok(());
        }
        // No token and an empty one are different callers to etcd ("user name is
        // empty" and "invalid auth token"): the kept key says which.
        let token = match metadata.get(TOKEN) {
            Some(t) => Bytes::from([b"+", t.as_bytes()].concat()),
            None => Bytes::from_static(b"-"),
        };
        let now = Instant::now();
        if let Some(v) = self.cached(&token, key, end, now) {
            return v.result();
        }
        let ask_key = (
            token.clone(),
            Bytes::copy_from_slice(key),
            Bytes::copy_from_slice(end),
        );
        // A decision asked for before the auth state moved is not kept after it.
        let generation = self.generation.load(Ordering::Acquire);
        let ask = {
            let mut asking = self.asking.lock();
            asking
                .entry(ask_key.clone())
                .or_insert_with(|| self.ask(ask_key.clone()))
                .clone()
        };
        let verdict = ask.await;
        self.asking.lock().remove(&ask_key);
        match verdict {
            Ok(v) => {
                if self.generation.load(Ordering::Acquire) == generation {
                    self.remember(&ask_key, v.clone(), now);
                }
                v.result()
            }
            Err((code, msg)) => Err(Status::new(code, msg)),
        }
    }

    /// A kept decision for `[key, end)` that is still fresh.
    fn cached(&self, token: &Bytes, key: &[u8], end: &[u8], now: Instant) -> Option<Verdict> {
        let mut decisions = self.decisions.lock();
        let entry = decisions.get_mut(token)?;
        entry.used = Some(now);
        let fresh = |d: &Decision| now.duration_since(d.at) < self.max_age;
        entry
            .list
            .iter()
            .filter(|d| fresh(d))
            .find_map(|d| match &d.verdict {
                Verdict::Allow if covers(&d.key, &d.end, key, end) => Some(Verdict::Allow),
                Verdict::Deny(..) if d.key == key && d.end == end => Some(d.verdict.clone()),
                _ => None,
            })
    }

    fn remember(&self, (token, key, end): &AskKey, verdict: Verdict, at: Instant) {
        tracing::debug!(key = ?key, end = ?end, ?verdict, "decision kept");
        let mut decisions = self.decisions.lock();
        if !decisions.contains_key(token) && decisions.len() >= MAX_TOKENS {
            let oldest = decisions
                .iter()
                .min_by_key(|(_, d)| d.used)
                .map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                decisions.remove(&t);
            }
        }
        let entry = decisions.entry(token.clone()).or_default();
        entry.used = Some(at);
        entry.list.retain(|d| !(d.key == *key && d.end == *end));
        if entry.list.len() >= MAX_RANGES_PER_TOKEN {
            entry.list.remove(0);
        }
        entry.list.push(Decision {
            key: key.clone(),
            end: end.clone(),
            verdict,
            at,
        });
    }

    /// One ask to etcd with the caller's token (shared by identical concurrent asks).
    fn ask(&self, (token, key, end): AskKey) -> Ask {
        let upstream = self.upstream.clone();
        crate::metrics::get().auth_ask();
        tracing::debug!(key = ?key, end = ?end, "asking etcd for a caller's permission");
        async move {
            let mut metadata = MetadataMap::new();
            if let Some(token) = token.strip_prefix(b"+") {
                let v = AsciiMetadataValue::try_from(token).map_err(|_| {
                    (
                        Code::Unauthenticated,
                        "etcdserver: invalid auth token".to_string(),
                    )
                })?;
                metadata.insert(TOKEN, v);
            }
            let req = RangeRequest {
                key,
                range_end: end,
                limit: 1,
                serializable: true,
                count_only: true,
                ..Default::default()
            };
            let up2 = upstream.clone();
            let answer = upstream
                .call("range", &metadata, req, move |q| {
                    let mut c = up2.kv();
                    async move { c.range(q).await }
                })
                .await;
            match answer {
                Ok(_) => Ok(Verdict::Allow),
                Err(s) if is_auth_refusal(&s) => {
                    Ok(Verdict::Deny(s.code(), s.message().to_string()))
                }
                Err(s) => Err((s.code(), s.message().to_string())),
            }
        }
        .boxed()
        .shared()
    }

    /// Learns etcd's auth state once: whether auth is on and, on etcd >= 3.5, its auth
    /// revision. Returns whether auth is on.
    ///
    /// # Errors
    /// Why etcd did not answer.
    pub(crate) async fn learn(&self) -> Result<bool, Status> {
        let (on, revision) = self.probe().await?;
        let was = self.upstream.auth_enabled();
        self.upstream.set_auth_enabled(on);
        let old = self.revision.swap(revision, Ordering::AcqRel);
        if was != on {
            tracing::info!(
                auth = on,
                "etcd's auth is {}",
                if on { "on" } else { "off" }
            );
            self.invalidate();
        } else if revision != old {
            tracing::debug!(revision, "etcd's auth revision moved: decisions dropped");
            self.invalidate();
        }
        Ok(on)
    }

    /// `(auth on, auth revision)`: `AuthStatus` where etcd has it (>= 3.5), else a
    /// Range without a token (etcd answers `user name is empty` while auth is on).
    async fn probe(&self) -> Result<(bool, u64), Status> {
        let upstream = &self.upstream;
        let status = upstream
            .own_call(AuthStatusRequest {}, |q| {
                let mut c = upstream.auth();
                async move { c.auth_status(q).await }
            })
            .await;
        match status {
            Ok(r) => {
                let r = r.into_inner();
                return Ok((r.enabled, r.auth_revision));
            }
            Err(s) if s.code() == Code::Unimplemented => {}
            // etcd >= 3.6 asks a caller of AuthStatus for a user while auth is on: the
            // proxy has none (no --user), so auth is on; its revision stays unknown and
            // decisions live as on 3.4.
            Err(s) if is_auth_refusal(&s) => return Ok((true, 0)),
            Err(s) => return Err(s),
        }
        let req = RangeRequest {
            key: Bytes::from_static(b"\0"),
            limit: 1,
            serializable: true,
            count_only: true,
            ..Default::default()
        };
        let answer = upstream.kv().range(tonic::Request::new(req)).await;
        match answer {
            Ok(_) if upstream.cert_identity().is_some() => {
                // Over the proxy's certificate the CN is the caller: an allowed Range
                // says nothing. Admin calls are refused to a non-root user with auth on.
                let list = upstream
                    .own_call(crate::pb::etcdserverpb::AuthRoleListRequest {}, |q| {
                        let mut c = upstream.auth();
                        async move { c.role_list(q).await }
                    })
                    .await;
                match list {
                    Ok(_) => Ok((false, 0)),
                    Err(s) if is_auth_refusal(&s) => Ok((true, 0)),
                    Err(s) => Err(s),
                }
            }
            Ok(_) => Ok((false, 0)),
            Err(s) if is_auth_refusal(&s) => Ok((true, 0)),
            Err(s) => Err(s),
        }
    }

    /// Whether etcd reports an auth revision (>= 3.5).
    fn has_revision(&self) -> bool {
        self.revision.load(Ordering::Acquire) != 0
    }

    /// Polls etcd's auth state every `interval`, until dropped. On etcd without an auth
    /// revision, decisions are dropped every [`RECHECK_WITHOUT_REVISION`] (asked again
    /// on their next use) and open watches are checked every
    /// [`WATCH_RECHECK_WITHOUT_REVISION`].
    pub(crate) fn spawn_poll(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let (mut forgot, mut rechecked) = (Instant::now(), Instant::now());
            loop {
                tokio::time::sleep(interval.min(RECHECK_WITHOUT_REVISION)).await;
                let Some(authz) = weak.upgrade() else { return };
                if let Err(e) = authz.learn().await {
                    tracing::debug!(error = %e, "learning etcd's auth state failed");
                }
                if !authz.enabled() || authz.has_revision() {
                    continue;
                }
                if rechecked.elapsed() >= WATCH_RECHECK_WITHOUT_REVISION {
                    (forgot, rechecked) = (Instant::now(), Instant::now());
                    authz.invalidate();
                } else if forgot.elapsed() >= RECHECK_WITHOUT_REVISION {
                    forgot = Instant::now();
                    authz.forget();
                }
            }
        })
    }
}

/// Whether the range `[key, end)` (etcd's forms: empty end one key, `"\0"` from key on)
/// lies inside the range `[start, stop)` of the same forms.
fn covers(start: &[u8], stop: &[u8], key: &[u8], end: &[u8]) -> bool {
    if key < start {
        return false;
    }
    // The allowed range's exclusive end; `None`: no bound.
    let one_key;
    let bound: Option<&[u8]> = match stop {
        b"\0" => None,
        b"" => {
            one_key = [start, b"\0"].concat();
            Some(&one_key)
        }
        s => Some(s),
    };
    match (end, bound) {
        (_, None) => true,
        (b"", Some(b)) => key < b,
        (b"\0", Some(_)) => false,
        (e, Some(b)) => e <= b,
    }
}

/// Refuses to start when the proxy's own etcd identity (`--user`, or the CN of `--cert`)
/// has etcd's root role, unless `--allow-root-upstream`: that identity feeds the cache,
/// so it needs read on the cached prefix and nothing else.
pub(crate) async fn check_upstream_identity(
    upstream: &Upstream,
    config: &crate::config::Config,
) -> crate::error::Result<()> {
    use crate::error::Error;
    let names: Vec<(String, &str)> = upstream
        .user()
        .map(|u| (u.to_string(), "--user"))
        .into_iter()
        .chain(
            upstream
                .cert_identity()
                .map(|cn| (cn.to_string(), "the CN of --cert")),
        )
        .collect();
    for (name, what) in names {
        let req = crate::pb::etcdserverpb::AuthUserGetRequest { name: name.clone() };
        let answer = upstream
            .own_call(req, |q| {
                let mut c = upstream.auth();
                async move { c.user_get(q).await }
            })
            .await;
        match answer {
            Ok(r) if r.get_ref().roles.iter().any(|r| r == "root") => {
                let who = format!("{what} ({name:?})");
                if !config.allow_root_upstream {
                    return Err(Error::RootUpstream(who));
                }
                tracing::warn!("{who} has etcd's root role (--allow-root-upstream)");
            }
            Ok(_) => {}
            // Not an etcd user (yet), or not one this identity may look up: not root.
            Err(s) if s.message().contains("user name not found") || is_auth_refusal(&s) => {
                tracing::debug!(user = %name, error = %s.message(), "identity check");
            }
            Err(s) => {
                return Err(Error::IdentityCheck {
                    user: name,
                    status: s,
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn an_allowed_range_covers_its_sub_ranges() {
        // One key covers itself only.
        assert!(covers(b"/a/x", b"", b"/a/x", b""));
        assert!(!covers(b"/a/x", b"", b"/a/y", b""));
        assert!(!covers(b"/a/x", b"", b"/a/x", b"/a/y"));
        assert!(covers(b"/a/x", b"", b"/a/x", b"/a/x\0"));
        // A prefix covers its keys and sub-prefixes, not beyond.
        assert!(covers(b"/a/", b"/a0", b"/a/x", b""));
        assert!(covers(b"/a/", b"/a0", b"/a/b/", b"/a/b0"));
        assert!(covers(b"/a/", b"/a0", b"/a/", b"/a0"));
        assert!(!covers(b"/a/", b"/a0", b"/a/", b"/b"));
        assert!(!covers(b"/a/", b"/a0", b"/a/", b"\0"));
        assert!(!covers(b"/a/", b"/a0", b"/", b"/a0"));
        // From a key on covers everything after it.
        assert!(covers(b"/a/", b"\0", b"/z", b"\0"));
        assert!(covers(b"/a/", b"\0", b"/z", b""));
        assert!(!covers(b"/a/", b"\0", b"/", b""));
    }
}
