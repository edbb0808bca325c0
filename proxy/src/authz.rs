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
//! messages, with a fixed overhead per decision), at most [`MAX_RANGES_PER_TOKEN`] per
//! token; the least recently used token's decisions go first, in O(1). Asks in flight
//! hold at most `--auth-ask-bytes` of keys; a check beyond that is refused with
//! `ResourceExhausted`, naming the limit. So distinct tokens with long keys cannot grow
//! the proxy beyond its bounds, and a repeated token, good or garbage, costs etcd one ask
//! per range and interval, not one per request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use lru::LruCache;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};

use crate::pb::etcdserverpb::{auth_client::AuthClient, AuthStatusRequest, RangeRequest};
use crate::status::is_auth_refusal;
use crate::upstream::{AuthState, Upstream, TOKEN};

/// Decisions kept per token at most (the oldest goes first).
pub(crate) const MAX_RANGES_PER_TOKEN: usize = 64;
/// Bytes counted for a decision beyond its key, range end and message (the entry, its
/// place in the token's list and the token's entry, rounded up).
const DECISION_OVERHEAD: usize = 128;
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

    fn bytes(&self) -> usize {
        match self {
            Verdict::Allow => 0,
            Verdict::Deny(_, msg) => msg.len(),
        }
    }
}

#[derive(Debug)]
struct Decision {
    key: Bytes,
    end: Bytes,
    verdict: Verdict,
    /// When it is no longer used (the token's TTL or `exp`).
    until: Instant,
}

impl Decision {
    fn bytes(&self) -> usize {
        self.key.len() + self.end.len() + self.verdict.bytes() + DECISION_OVERHEAD
    }
}

/// One token's decisions.
#[derive(Debug)]
struct TokenDecisions {
    list: Vec<Decision>,
    /// The bytes of `list` and of the token.
    bytes: usize,
    /// When one of them was last used or kept.
    used: Instant,
}

/// Every token's decisions, bounded in bytes; the least recently used token goes first.
struct Decisions {
    by_token: LruCache<Bytes, TokenDecisions>,
    bytes: usize,
    limit: usize,
}

impl Decisions {
    fn new(limit: usize) -> Decisions {
        Decisions {
            by_token: LruCache::unbounded(),
            bytes: 0,
            limit,
        }
    }

    fn clear(&mut self) {
        self.by_token.clear();
        self.bytes = 0;
    }

    fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// Drops the decisions of tokens not used for `idle` (the least recently used go
    /// first, so this stops at the first token used since).
    fn prune_unused(&mut self, now: Instant, idle: Duration) {
        while let Some((_, d)) = self.by_token.peek_lru() {
            if now.saturating_duration_since(d.used) < idle {
                break;
            }
            if let Some((_, gone)) = self.by_token.pop_lru() {
                self.bytes -= gone.bytes;
            }
        }
    }

    /// A kept decision for `[key, end)` still in force at `now` (marks the token used).
    fn find(&mut self, token: &Bytes, key: &[u8], end: &[u8], now: Instant) -> Option<Verdict> {
        let entry = self.by_token.get_mut(token)?;
        entry.used = now;
        entry
            .list
            .iter()
            .filter(|d| now < d.until)
            .find_map(|d| match &d.verdict {
                Verdict::Allow if covers(&d.key, &d.end, key, end) => Some(Verdict::Allow),
                Verdict::Deny(..) if d.key == key && d.end == end => Some(d.verdict.clone()),
                _ => None,
            })
    }

    fn insert(&mut self, token: &Bytes, d: Decision) {
        let cost = d.bytes();
        if cost + token.len() > self.limit {
            return;
        }
        if !self.by_token.contains(token) {
            self.by_token.put(
                token.clone(),
                TokenDecisions {
                    list: Vec::new(),
                    bytes: token.len(),
                    used: Instant::now(),
                },
            );
            self.bytes += token.len();
        }
        let entry = self.by_token.get_mut(token).expect("just inserted");
        entry.used = Instant::now();
        let before = entry.bytes;
        entry.list.retain(|o| !(o.key == d.key && o.end == d.end));
        if entry.list.len() >= MAX_RANGES_PER_TOKEN {
            entry.list.remove(0);
        }
        entry.list.push(d);
        entry.bytes = token.len() + entry.list.iter().map(Decision::bytes).sum::<usize>();
        self.bytes = self.bytes - before + entry.bytes;
        while self.bytes > self.limit {
            match self.by_token.pop_lru() {
                Some((_, gone)) => self.bytes -= gone.bytes,
                None => break,
            }
        }
    }
}

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
        self.upstream.auth_state() != AuthState::Off
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

    /// Learns etcd's auth state once: whether auth is on and, while something depends on
    /// it on etcd >= 3.5, its auth revision. Returns whether auth is on.
    ///
    /// Nothing here goes through etcd's raft log unless auth is on and the proxy serves
    /// callers from memory (it keeps decisions used within [`IDLE_AFTER`], or a Watch
    /// stream is open): whether auth is on is one read (a linearizable Range without a
    /// user, which etcd refuses with `user name is empty` while auth is on).
    /// `AuthStatus`, a raft request on every version that has it (3.5, 3.6, 3.7:
    /// `raftRequest(AuthStatus)` in etcd's v3_server.go), is asked only then, as the one
    /// way to see the auth revision move. So an idle proxy, or one in front of an etcd
    /// with auth off, writes nothing to etcd's log.
    ///
    /// # Errors
    /// Why etcd did not answer.
    pub(crate) async fn learn(&self) -> Result<bool, Status> {
        let asked = {
            let mut learns = self.learns.lock();
            learns.0 += 1;
            learns.0
        };
        let kept = {
            let mut d = self.decisions.lock();
            d.prune_unused(Instant::now(), IDLE_AFTER);
            !d.is_empty()
        };
        // One receiver is the cache slot's; the others are Watch streams', whose cached
        // watches are checked again when the revision moves.
        let streams = self.epoch.receiver_count() > 1;
        let active = self.upstream.auth_state() == AuthState::On && (kept || streams);
        let status = if active && !self.no_auth_status.load(Ordering::Acquire) {
            self.auth_status().await?
        } else {
            None
        };
        let (on, revision) = match status {
            Some(s) => s,
            None => (self.probe().await?, 0),
        };
        let mut learns = self.learns.lock();
        if learns.1 > asked {
            // A learn asked later has answered already.
            return Ok(self.upstream.auth_state() == AuthState::On);
        }
        learns.1 = asked;
        let was = self.upstream.auth_state();
        self.upstream.set_auth_enabled(on);
        // The last revision seen stays while it is not asked: a move in between is seen
        // when it is asked again.
        let old = match revision {
            0 => self.revision.load(Ordering::Acquire),
            r => self.revision.swap(r, Ordering::AcqRel),
        };
        let now = if on { AuthState::On } else { AuthState::Off };
        if was != now {
            tracing::info!(
                auth = on,
                "etcd's auth is {}",
                if on { "on" } else { "off" }
            );
            self.invalidate();
        } else if revision != 0 && revision != old {
            // Also from unknown (0), the first answer: a change between the first asks
            // and it is not seen otherwise.
            tracing::debug!(revision, "etcd's auth revision moved: decisions dropped");
            self.invalidate();
        }
        Ok(on)
    }

    /// `AuthStatus`: `Some((auth on, auth revision))`, or `None` where etcd has none (3.4)
    /// or refuses it to the proxy (>= 3.6 asks for a user while auth is on, and the proxy
    /// may have none): then never asked again.
    async fn auth_status(&self) -> Result<Option<(bool, u64)>, Status> {
        let upstream = &self.upstream;
        // A raft request: hedged, so a member that lags does not delay what it says.
        let status = upstream
            .hedged(|channel| {
                upstream.own_call(AuthStatusRequest {}, move |q| {
                    let mut c = AuthClient::new(channel.clone());
                    async move { c.auth_status(q).await }
                })
            })
            .await;
        match status {
            Ok(r) => {
                let r = r.into_inner();
                Ok(Some((r.enabled, r.auth_revision)))
            }
            Err(s) if s.code() == Code::Unimplemented || is_auth_refusal(&s) => {
                self.no_auth_status.store(true, Ordering::Release);
                Ok(None)
            }
            Err(s) => Err(s),
        }
    }

    /// Whether auth is on: a linearizable Range without a user (etcd answers `user name
    /// is empty` while auth is on). It never goes as the proxy's certificate
    /// (`Upstream::request`): etcd would take its CN as the caller and let it through.
    async fn probe(&self) -> Result<bool, Status> {
        let upstream = &self.upstream;
        let req = RangeRequest {
            key: Bytes::from_static(b"\0"),
            limit: 1,
            count_only: true,
            ..Default::default()
        };
        let metadata = MetadataMap::new();
        // Linearizable: hedged like the asks.
        let answer = upstream
            .hedged(|channel| {
                upstream.call(&metadata, req.clone(), move |q| {
                    let mut c = Upstream::kv_on(channel.clone());
                    async move { c.range(q).await }
                })
            })
            .await;
        match answer {
            Ok(_) => Ok(false),
            Err(s) if is_auth_refusal(&s) => Ok(true),
            Err(s) => Err(s),
        }
    }

    /// Whether etcd reports an auth revision (>= 3.5) that the proxy follows.
    fn has_revision(&self) -> bool {
        self.revision.load(Ordering::Acquire) != 0 && !self.no_auth_status.load(Ordering::Acquire)
    }

    /// Polls etcd's auth state every `interval`, until dropped. On etcd without an auth
    /// revision, decisions are dropped every [`RECHECK_WITHOUT_REVISION`] (asked again
    /// on their next use) and open watches are checked every
    /// [`WATCH_RECHECK_WITHOUT_REVISION`].
    ///
    /// Each poll runs beside the timer, up to [`POLLS_IN_FLIGHT`] at a time: a slow
    /// answer (a member that lags, or etcd out of reach until the call's timeout) holds
    /// back neither the next poll, which may reach another member, nor the drops, which
    /// keep decisions within their age whatever etcd answers.
    pub(crate) fn spawn_poll(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.min(RECHECK_WITHOUT_REVISION));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is at once
            let polls = Arc::new(tokio::sync::Semaphore::new(POLLS_IN_FLIGHT));
            let (mut forgot, mut rechecked) = (Instant::now(), Instant::now());
            loop {
                tick.tick().await;
                let Some(authz) = weak.upgrade() else { return };
                if let Ok(permit) = polls.clone().try_acquire_owned() {
                    let authz = authz.clone();
                    tokio::spawn(async move {
                        if let Err(e) = authz.learn().await {
                            tracing::debug!(error = %e, "learning etcd's auth state failed");
                        }
                        drop(permit);
                    });
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

/// The `exp` claim of a JWT (`header.payload.signature`, the payload base64url JSON), if
/// `token` is one that has it. etcd's simple tokens (`random.index`) are not.
fn jwt_expiry(token: &[u8]) -> Option<SystemTime> {
    use base64::Engine;
    let mut parts = token.split(|b| *b == b'.');
    let (_, payload, _, none) = (parts.next()?, parts.next()?, parts.next()?, parts.next());
    if none.is_some() {
        return None;
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    (exp >= 0.0).then(|| UNIX_EPOCH + Duration::from_secs_f64(exp.min(1e12)))
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

/// Refuses to start when the proxy's own etcd identity (`--user`, or the CN of `--cert`,
/// each checked on its own) has etcd's root role, unless `--allow-root-upstream`: that
/// identity feeds the cache, so it needs read on the cached prefix and nothing else.
///
/// `--user` is looked up with its own token, and the CN as the CN itself (a call over the
/// certificate with no token): etcd lets every user read its own entry, so a root CN is
/// found whatever `--user` may read.
pub(crate) async fn check_upstream_identity(
    upstream: &Upstream,
    config: &crate::config::Config,
) -> crate::error::Result<()> {
    use crate::pb::etcdserverpb::AuthUserGetRequest;
    if let Some(name) = upstream.user() {
        let req = AuthUserGetRequest {
            name: name.to_string(),
        };
        let answer = upstream
            .own_call(req, |q| {
                let mut c = upstream.auth();
                async move { c.user_get(q).await }
            })
            .await;
        judge_identity(config, name, "--user", answer)?;
    }
    if let Some(cn) = upstream.cert_identity() {
        let req = upstream.certificate_request(AuthUserGetRequest {
            name: cn.to_string(),
        });
        let answer = upstream.auth().user_get(req).await;
        judge_identity(config, cn, "the CN of --cert", answer)?;
    }
    Ok(())
}

/// Whether `name`'s roles (etcd's answer to its `UserGet`) may be the proxy's identity.
fn judge_identity(
    config: &crate::config::Config,
    name: &str,
    what: &str,
    answer: Result<tonic::Response<crate::pb::etcdserverpb::AuthUserGetResponse>, Status>,
) -> crate::error::Result<()> {
    use crate::error::Error;
    match answer {
        Ok(r) if r.get_ref().roles.iter().any(|r| r == "root") => {
            let who = format!("{what} ({name:?})");
            if !config.allow_root_upstream {
                return Err(Error::RootUpstream(who));
            }
            tracing::warn!("{who} has etcd's root role (--allow-root-upstream)");
            Ok(())
        }
        Ok(_) => Ok(()),
        // Not an etcd user (yet): not root. A refusal of a user's own entry: no user
        // etcd knows (an empty CN, an expired token), so not root either.
        Err(s) if s.message().contains("user name not found") || is_auth_refusal(&s) => {
            tracing::debug!(user = %name, error = %s.message(), "identity check");
            Ok(())
        }
        Err(s) => Err(Error::IdentityCheck {
            user: name.to_string(),
            status: s,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(key: &[u8], until: Instant) -> Decision {
        Decision {
            key: Bytes::copy_from_slice(key),
            end: Bytes::new(),
            verdict: Verdict::Deny(Code::Unauthenticated, "invalid auth token".into()),
            until,
        }
    }

    /// Distinct tokens with long keys: the decisions never hold more than their bound,
    /// the least recently used token goes first, and one decision above the bound is not
    /// kept at all.
    #[test]
    fn decisions_are_bounded_in_bytes_and_the_least_recently_used_token_goes() {
        let limit = 1 << 20;
        let mut d = Decisions::new(limit);
        let later = Instant::now() + Duration::from_secs(60);
        let key = vec![b'k'; 100 << 10];
        for i in 0..100u32 {
            let token = Bytes::from(format!("+garbage{i}"));
            d.insert(&token, decision(&key, later));
            assert!(d.bytes <= limit, "{} bytes after {i}", d.bytes);
            // The first token stays in use: it is never the least recently used.
            let first = Bytes::from_static(b"+garbage0");
            assert!(d.find(&first, &key, b"", Instant::now()).is_some(), "{i}");
        }
        assert!(d.by_token.len() < 12, "{}", d.by_token.len());
        assert!(d
            .find(&Bytes::from_static(b"+garbage1"), &key, b"", Instant::now())
            .is_none());
        let huge = vec![b'k'; 2 << 20];
        d.insert(&Bytes::from_static(b"+huge"), decision(&huge, later));
        assert!(d.bytes <= limit);
        assert!(!d.by_token.contains(&Bytes::from_static(b"+huge")));
    }

    /// A decision is used until its `until`, not after.
    #[test]
    fn a_decision_is_not_used_past_its_end() {
        let mut d = Decisions::new(1 << 20);
        let now = Instant::now();
        let token = Bytes::from_static(b"+t");
        d.insert(&token, decision(b"/a", now + Duration::from_secs(1)));
        assert!(d.find(&token, b"/a", b"", now).is_some());
        assert!(d
            .find(&token, b"/a", b"", now + Duration::from_secs(1))
            .is_none());
    }

    /// A JWT's `exp`; a simple token (`random.index`) and garbage have none.
    #[test]
    fn a_jwts_expiry_is_read_from_its_payload() {
        use base64::Engine;
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = format!(
            "{}.{}.sig",
            enc(r#"{"alg":"ES256"}"#),
            enc(r#"{"username":"reader","revision":5,"exp":1900000000}"#)
        );
        assert_eq!(
            jwt_expiry(jwt.as_bytes()),
            Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000))
        );
        assert_eq!(jwt_expiry(b"QWERTYuiop.42"), None);
        assert_eq!(jwt_expiry(b"a.b.c"), None);
        assert_eq!(jwt_expiry(b"a.b.c.d"), None);
    }

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

/// [`Authz`] against a scripted etcd: a KV server that hands each Range to the test,
/// which answers it (allowed or not) when it wants.
#[cfg(test)]
mod scripted {
    use super::*;
    use crate::pb::etcdserverpb::kv_server::{Kv, KvServer};
    use crate::pb::etcdserverpb::{
        CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
        PutResponse, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
    };
    use clap::Parser;
    use tokio::sync::{mpsc, oneshot};
    use tonic::{Request, Response};

    /// A Range that reached the scripted etcd: whether it was serializable, and where the
    /// test says whether it is allowed.
    struct Seen {
        serializable: bool,
        /// Which scripted member it reached.
        member: usize,
        answer: oneshot::Sender<bool>,
    }

    impl Seen {
        fn answer(self, allow: bool) {
            let _ = self.answer.send(allow);
        }
    }

    struct ScriptedKv(mpsc::UnboundedSender<Seen>, usize);

    fn unscripted<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("scripted"))
    }

    #[tonic::async_trait]
    impl Kv for ScriptedKv {
        async fn range(&self, r: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
            let (answer, allowed) = oneshot::channel();
            let serializable = r.get_ref().serializable;
            let _ = self.0.send(Seen {
                serializable,
                member: self.1,
                answer,
            });
            match allowed.await {
                Ok(true) => Ok(Response::new(RangeResponse::default())),
                _ => Err(Status::permission_denied("etcdserver: permission denied")),
            }
        }
        async fn put(&self, _: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
            unscripted()
        }
        async fn delete_range(
            &self,
            _: Request<DeleteRangeRequest>,
        ) -> Result<Response<DeleteRangeResponse>, Status> {
            unscripted()
        }
        async fn txn(&self, _: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
            unscripted()
        }
        async fn compact(
            &self,
            _: Request<CompactionRequest>,
        ) -> Result<Response<CompactionResponse>, Status> {
            unscripted()
        }
        type RangeStreamStream = futures::stream::Empty<Result<RangeStreamResponse, Status>>;
        async fn range_stream(
            &self,
            _: Request<RangeRequest>,
        ) -> Result<Response<Self::RangeStreamStream>, Status> {
            unscripted()
        }
    }

    /// An [`Authz`] with etcd's auth on, in front of the scripted etcd whose Ranges come
    /// out of the receiver.
    async fn scripted() -> (Arc<Authz>, mpsc::UnboundedReceiver<Seen>) {
        scripted_members(1).await
    }

    /// The same over `n` scripted members, each an endpoint.
    async fn scripted_members(n: usize) -> (Arc<Authz>, mpsc::UnboundedReceiver<Seen>) {
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let mut urls = Vec::new();
        for member in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            urls.push(format!("http://{}", listener.local_addr().unwrap()));
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(KvServer::new(ScriptedKv(seen_tx.clone(), member)))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
            );
        }
        let config =
            crate::config::Config::parse_from(["etcd-cache-proxy", "--endpoints", &urls.join(",")]);
        let upstream = Upstream::new(&config).unwrap();
        upstream.set_auth_enabled(true);
        let authz = Authz::new(upstream, Duration::from_secs(300), 1 << 20, 1 << 20);
        (authz, seen)
    }

    /// The next Range to reach etcd; a failure (not a hang) when none comes.
    async fn next_ask(seen: &mut mpsc::UnboundedReceiver<Seen>, what: &str) -> Seen {
        match tokio::time::timeout(Duration::from_secs(10), seen.recv()).await {
            Ok(Some(s)) => s,
            _ => panic!("no ask reached etcd: {what}"),
        }
    }

    fn caller(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(TOKEN, token.parse().unwrap());
        m
    }

    fn spawn_check(authz: &Arc<Authz>, token: &str) -> tokio::task::JoinHandle<Result<(), Status>> {
        let (authz, m) = (authz.clone(), caller(token));
        tokio::spawn(async move { authz.check(&m, b"/a", b"").await })
    }

    /// An ask goes to etcd as a linearizable read: a follower that has not applied a
    /// revocation cannot answer it with the old permission.
    #[tokio::test]
    async fn an_ask_is_a_linearizable_read() {
        let (authz, mut seen) = scripted().await;
        let check = spawn_check(&authz, "t1");
        let ask = next_ask(&mut seen, "the check").await;
        assert!(!ask.serializable, "the ask was serializable");
        ask.answer(true);
        check.await.unwrap().unwrap();
    }

    /// An ask in flight when decisions are dropped (a revocation) answers the callers
    /// that waited for it, but is not kept, and a check after the drop does not join it:
    /// it asks etcd again, and its answer is the one kept, whichever answers last.
    #[tokio::test]
    async fn an_ask_in_flight_at_a_revocation_is_neither_kept_nor_joined() {
        let (authz, mut seen) = scripted().await;
        let first = spawn_check(&authz, "t1");
        let before = next_ask(&mut seen, "the first check").await;
        // The revocation lands while the first ask is in flight.
        authz.invalidate();
        let second = spawn_check(&authz, "t1");
        let after = next_ask(
            &mut seen,
            "a check after the revocation joined the ask from before it",
        )
        .await;
        // The new answer comes first, then the old one (etcd answered it from the state
        // before the revocation).
        after.answer(false);
        let refused = second.await.unwrap().unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        before.answer(true);
        assert!(
            first.await.unwrap().is_ok(),
            "the first caller gets its answer"
        );
        // The old answer was not kept over the new one, and the next check asks nothing.
        let again = authz.check(&caller("t1"), b"/a", b"").await.unwrap_err();
        assert_eq!(
            again.code(),
            Code::PermissionDenied,
            "the old answer was kept"
        );
        assert!(seen.try_recv().is_err(), "a kept decision asks nothing");
    }

    /// Learns overlap (a poll does not wait behind one stuck on a slow member): an
    /// answer older than one applied already is dropped, so a stale "auth off" never
    /// follows a newer "on".
    #[tokio::test]
    async fn an_older_learn_answering_last_is_dropped() {
        let (authz, mut seen) = scripted().await;
        let a = authz.clone();
        let older = tokio::spawn(async move { a.learn().await });
        let old_probe = next_ask(&mut seen, "the first learn").await;
        let a = authz.clone();
        let newer = tokio::spawn(async move { a.learn().await });
        let new_probe = next_ask(&mut seen, "the second learn").await;
        // etcd refuses a caller without a user: auth is on.
        new_probe.answer(false);
        assert!(newer.await.unwrap().unwrap(), "the newer learn saw auth on");
        // The older probe answers last, from before auth was turned on.
        old_probe.answer(true);
        older.await.unwrap().unwrap();
        assert_eq!(
            authz.upstream().auth_state(),
            AuthState::On,
            "an older answer turned auth off after a newer one"
        );
    }

    /// A member that sits on an ask (one that lags answers a linearizable read only
    /// after a round trip to the leader) does not hold a decision back: after
    /// `HEDGE_AFTER` the ask also goes to each member on its own connection, and the
    /// first answer decides.
    #[tokio::test]
    async fn an_ask_one_member_sits_on_is_answered_by_another() {
        let (authz, mut seen) = scripted_members(2).await;
        let check = spawn_check(&authz, "t1");
        // Left unanswered, as are the asks to the same member.
        let sat_on = next_ask(&mut seen, "the check").await;
        let mut held = Vec::new();
        let other = loop {
            let ask = next_ask(&mut seen, "the ask to every member").await;
            if ask.member != sat_on.member {
                break ask;
            }
            held.push(ask);
        };
        assert!(!other.serializable, "the hedged ask was serializable");
        other.answer(false);
        let refused = tokio::time::timeout(Duration::from_secs(10), check)
            .await
            .expect("the other member's answer decided")
            .unwrap()
            .unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        drop((sat_on, held));
    }

    /// The same ask from many callers at once is one ask to etcd.
    #[tokio::test]
    async fn identical_asks_in_flight_are_one() {
        let (authz, mut seen) = scripted().await;
        let checks: Vec<_> = (0..10).map(|_| spawn_check(&authz, "t1")).collect();
        let ask = next_ask(&mut seen, "ten checks").await;
        // Every caller joins the ask before etcd answers it (each holds a handle on it,
        // beside the one kept while it is in flight).
        let joined = || {
            authz
                .asking
                .lock()
                .asks
                .values()
                .next()
                .and_then(|f| f.ask.strong_count())
                .unwrap_or(0)
        };
        tokio::time::timeout(Duration::from_secs(10), async {
            while joined() < 11 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("ten checks joined one ask");
        ask.answer(true);
        for c in checks {
            c.await.unwrap().unwrap();
        }
        assert!(seen.try_recv().is_err(), "one ask for ten callers");
    }
}
