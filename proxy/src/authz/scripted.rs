//! [`Authz`] against a scripted etcd: a KV server that hands each Range to the test,
//! which answers it (allowed or not) when it wants.

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
    let authz = Authz::new(upstream, Duration::from_secs(300), 1 << 20, 1 << 20);
    authz.set_state(true);
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
        authz.state(),
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
