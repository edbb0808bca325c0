//! What the cache serves, it serves only to a caller etcd would allow: [`Authz`] asks
//! etcd once per (token, key range) with the caller's own token, keeps the decision, and
//! drops it when etcd's auth state moves.
//!
//! ## The ask
//! A linearizable, count-only Range with limit 1 on the caller's range, with the caller's
//! token (or, for a caller without one, without a user: never the proxy's certificate,
//! see `Upstream::request`): checked by etcd exactly as the caller's own Range
//! (`isOpPermitted`), by a member that has applied every auth change committed before
//! it (a serializable ask could hit a follower that has not applied a revocation yet).
//! Identical asks that are in flight together are one ask. An allow for a range covers
//! its sub-ranges; a deny covers only that range. A refusal is kept with etcd's own
//! status (code and message), so a client library's retry and re-auth logic works
//! unchanged. Other failures (etcd unreachable) are not kept.
//!
//! ## How long a decision lives
//! - Until etcd's auth state moves. etcd >= 3.5 reports its auth revision in
//!   `AuthStatus`, which the proxy polls every `--auth-check-interval`; on 3.4, which has
//!   no `AuthStatus`, every decision is re-asked after [`RECHECK_WITHOUT_REVISION`] (2 s)
//!   and open watches are checked every [`WATCH_RECHECK_WITHOUT_REVISION`] (10 s). An
//!   auth call forwarded through the proxy (user, role, permission, enable, disable)
//!   drops them at once. Asks in flight when decisions are dropped are forgotten too:
//!   their answers serve the callers that waited for them, and are not kept.
//! - Never past the token's own end: half of `--auth-token-ttl` from the ask (etcd's
//!   simple-token TTL, 300 s by default, which etcd counts from the token's last use:
//!   a cached read does not use it on etcd), and for a JWT (`--auth-token jwt,...`) not
//!   past its `exp` claim.
//!
//! While etcd's auth state is not known yet (before the first answer, or in front of a
//! learner), every caller is asked about as with auth on.
//!
//! When decisions are dropped, the [`epoch`](Authz::epoch) moves: every Watch stream
//! re-checks its cached watches (and creates not answered yet) and cancels the ones now
//! refused, with etcd's reason.
//!
//! ## Auth off
//! With etcd's auth off, [`Authz::check`] is one atomic load. The poll is one request per
//! interval, to notice auth being turned on.
//!
//! ## Bounds
//! The decisions are kept in at most `--auth-cache-bytes` (keys, range ends, tokens and
//! messages, with a fixed overhead per decision), at most
//! [`MAX_RANGES_PER_TOKEN`](decisions::MAX_RANGES_PER_TOKEN) per token; the least
//! recently used token's decisions go first, in O(1). Asks in flight hold at most
//! `--auth-ask-bytes` of keys; a check beyond that is refused with
//! `ResourceExhausted`, naming the limit. So distinct tokens with long keys cannot grow
//! the proxy beyond its bounds, and a repeated token, good or garbage, costs etcd one ask
//! per range and interval, not one per request.

mod decisions;
mod identity;
mod learn;
#[cfg(test)]
mod scripted;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};

use crate::etcd_errors::is_auth_refusal;
use crate::pb::etcdserverpb::RangeRequest;
use crate::upstream::{Upstream, TOKEN};

use decisions::{jwt_expiry, Decision, Decisions, Verdict, DECISION_OVERHEAD};
pub(crate) use identity::check_upstream_identity;

/// Decisions of a token not used for this long are dropped: the proxy is idle for that
/// caller, and an idle proxy asks etcd nothing that goes through raft.
const IDLE_AFTER: Duration = Duration::from_secs(10);
/// Polls of etcd's auth state in flight at most (see [`Authz::spawn_poll`]).
const POLLS_IN_FLIGHT: usize = 4;
/// On etcd without `AuthStatus` (3.4), how long a decision lives.
pub(crate) const RECHECK_WITHOUT_REVISION: Duration = Duration::from_secs(2);
/// On etcd without `AuthStatus` (3.4), how often open cached watches are checked again
/// (each check is one ask per distinct token and range with open watches).
pub(crate) const WATCH_RECHECK_WITHOUT_REVISION: Duration = Duration::from_secs(10);

/// The (token, key, range end) of an ask; the token as kept (`+token` or `-`).
type AskKey = (Bytes, Bytes, Bytes);
type Ask = Shared<BoxFuture<'static, Result<Verdict, (Code, String)>>>;

/// An ask in flight.
struct InFlight {
    ask: Ask,
    /// The generation it was started in: its answer is kept only if no invalidation came
    /// since.
    generation: u64,
    /// When it was sent: a decision's lifetime counts from here, also for the callers
    /// that joined it later.
    asked: Instant,
    bytes: usize,
}

/// The asks in flight, bounded in bytes.
struct Asking {
    asks: HashMap<AskKey, InFlight>,
    bytes: usize,
}

/// The decisions, the asks in flight and etcd's auth state.
pub(crate) struct Authz {
    upstream: Arc<Upstream>,
    decisions: Mutex<Decisions>,
    asking: Mutex<Asking>,
    ask_limit: usize,
    /// etcd's auth state as last learned (an [`AuthState`]).
    state: AtomicU8,
    /// etcd's auth revision (`AuthStatus`), 0 when unknown.
    revision: AtomicU64,
    /// etcd has no `AuthStatus` (3.4), or refuses it to the proxy.
    no_auth_status: AtomicBool,
    max_age: Duration,
    epoch: watch::Sender<u64>,
    /// Moves whenever decisions are dropped: a decision asked for before is not kept.
    generation: AtomicU64,
    /// Numbers the learns in the order they ask; the newest answer applied so far.
    /// Learns may overlap (a poll does not wait behind one stuck on a slow member): an
    /// answer older than one applied already is dropped, so a stale "auth off" never
    /// follows a newer "on".
    learns: Mutex<(u64, u64)>,
}

/// etcd's auth state as the proxy knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AuthState {
    /// Not learned yet (before the first answer, or etcd is a learner that cannot tell):
    /// every caller is asked about as with auth on.
    Unknown = 0,
    Off = 1,
    On = 2,
}

impl Authz {
    /// The upstream the checks ask.
    pub(crate) fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// Decisions living at most half of `token_ttl`, in at most `cache_bytes`; asks in
    /// flight holding at most `ask_bytes`.
    pub(crate) fn new(
        upstream: Arc<Upstream>,
        token_ttl: Duration,
        cache_bytes: usize,
        ask_bytes: usize,
    ) -> Arc<Authz> {
        Arc::new(Authz {
            upstream,
            decisions: Mutex::new(Decisions::new(cache_bytes)),
            asking: Mutex::new(Asking {
                asks: HashMap::new(),
                bytes: 0,
            }),
            ask_limit: ask_bytes,
            state: AtomicU8::new(AuthState::Unknown as u8),
            revision: AtomicU64::new(0),
            no_auth_status: AtomicBool::new(false),
            max_age: (token_ttl / 2).max(Duration::from_millis(100)),
            epoch: watch::channel(0).0,
            generation: AtomicU64::new(0),
            learns: Mutex::new((0, 0)),
        })
    }

    /// Moves when decisions were dropped: cached watches are checked again.
    pub(crate) fn epoch(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// Whether etcd's auth may be on: it is, or the proxy does not know yet. Callers are
    /// asked about unless etcd's auth is known to be off.
    pub(crate) fn enabled(&self) -> bool {
        self.state() != AuthState::Off
    }

    /// etcd's auth state, as last learned.
    pub(crate) fn state(&self) -> AuthState {
        match self.state.load(Ordering::Acquire) {
            1 => AuthState::Off,
            2 => AuthState::On,
            _ => AuthState::Unknown,
        }
    }

    /// Records what the proxy learned of etcd's auth state.
    fn set_state(&self, on: bool) {
        let state = if on { AuthState::On } else { AuthState::Off };
        self.state.store(state as u8, Ordering::Release);
    }

    /// Forgets every decision (etcd's auth state moved) and tells the Watch streams.
    pub(crate) fn invalidate(&self) {
        self.forget();
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Forgets every decision and every ask in flight; the next use of each asks etcd
    /// again.
    fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        crate::metrics::get().auth_decisions_dropped();
        self.decisions.lock().clear();
        let mut asking = self.asking.lock();
        asking.asks.clear();
        asking.bytes = 0;
    }

    /// Whether the caller of `metadata` may read `[key, end)` (etcd's keyspace; empty end: one
    /// key, `"\0"`: from key on) as etcd would decide it now.
    ///
    /// # Errors
    /// etcd's refusal, as etcd gave it; why etcd could not be asked; or `ResourceExhausted`
    /// when asks in flight already hold `--auth-ask-bytes`.
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
        if let Some(v) = self.decisions.lock().find(&token, key, end, Instant::now()) {
            return v.result();
        }
        let ask_key = (
            token.clone(),
            Bytes::copy_from_slice(key),
            Bytes::copy_from_slice(end),
        );
        let (ask, generation, started) = self.join_or_ask(&ask_key)?;
        let verdict = ask.clone().await;
        {
            let mut asking = self.asking.lock();
            if asking
                .asks
                .get(&ask_key)
                .is_some_and(|f| f.generation == generation)
            {
                let gone = asking.asks.remove(&ask_key).expect("just seen");
                asking.bytes -= gone.bytes;
            }
        }
        match verdict {
            Ok(v) => {
                // Kept only if no invalidation came since the ask started.
                if self.generation.load(Ordering::Acquire) == generation {
                    let until = self.until(&token, started);
                    if until > Instant::now() {
                        tracing::debug!(key = ?ask_key.1, end = ?ask_key.2, verdict = ?v, "decision kept");
                        let (_, key, end) = ask_key;
                        self.decisions.lock().insert(
                            &token,
                            Decision {
                                key,
                                end,
                                verdict: v.clone(),
                                until,
                            },
                        );
                    }
                }
                v.result()
            }
            Err((code, msg)) => Err(Status::new(code, msg)),
        }
    }

    /// The ask in flight for `ask_key`, or a new one; with its generation.
    fn join_or_ask(&self, ask_key: &AskKey) -> Result<(Ask, u64, Instant), Status> {
        let mut asking = self.asking.lock();
        if let Some(f) = asking.asks.get(ask_key) {
            return Ok((f.ask.clone(), f.generation, f.asked));
        }
        let bytes = ask_key.0.len() + ask_key.1.len() + ask_key.2.len() + DECISION_OVERHEAD;
        if asking.bytes + bytes > self.ask_limit {
            crate::metrics::get().auth_ask_refused();
            return Err(Status::resource_exhausted(format!(
                "etcd-cache-proxy: too many permission checks in flight: their keys hold at \
                 most {} bytes (--auth-ask-bytes)",
                self.ask_limit
            )));
        }
        // Read under the lock that `forget` takes: an ask started here belongs to this
        // generation or a later one's `forget` drops it.
        let generation = self.generation.load(Ordering::Acquire);
        let ask = self.ask(ask_key.clone());
        // Polled first by this caller, right after it returns.
        let asked = Instant::now();
        asking.asks.insert(
            ask_key.clone(),
            InFlight {
                ask: ask.clone(),
                generation,
                asked,
                bytes,
            },
        );
        asking.bytes += bytes;
        Ok((ask, generation, asked))
    }

    /// Until when a decision asked for at `asked` may be used: half the token TTL, and
    /// never past a JWT's `exp`.
    fn until(&self, token: &Bytes, asked: Instant) -> Instant {
        let by_ttl = asked + self.max_age;
        let Some(jwt) = token.strip_prefix(b"+") else {
            return by_ttl;
        };
        match jwt_expiry(jwt) {
            Some(exp) => {
                let left = exp
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                by_ttl.min(Instant::now() + left)
            }
            None => by_ttl,
        }
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
                count_only: true,
                ..Default::default()
            };
            // Linearizable (the Range is not serializable), so hedged: a member that
            // lags does not hold a decision back.
            let answer = upstream
                .hedged(|channel| {
                    let (upstream, metadata, req) = (&upstream, &metadata, req.clone());
                    async move {
                        upstream
                            .call(metadata, req, move |q| {
                                let mut c = Upstream::kv_on(channel.clone());
                                async move { c.range(q).await }
                            })
                            .await
                    }
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
}
