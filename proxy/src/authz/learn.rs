//! How the proxy learns etcd's auth state: whether auth is on, and on etcd >= 3.5 its
//! auth revision, polled every `--auth-check-interval`; a move drops every decision.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use super::AuthState;
use crate::etcd_errors::is_auth_refusal;
use crate::pb::etcdserverpb::{auth_client::AuthClient, AuthStatusRequest, RangeRequest};
use crate::upstream::Upstream;

use super::{
    Authz, IDLE_AFTER, POLLS_IN_FLIGHT, RECHECK_WITHOUT_REVISION, WATCH_RECHECK_WITHOUT_REVISION,
};

impl Authz {
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
        let active = self.state() == AuthState::On && (kept || streams);
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
            return Ok(self.state() == AuthState::On);
        }
        learns.1 = asked;
        let was = self.state();
        self.set_state(on);
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
