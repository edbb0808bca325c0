//! Reads and watches from now that wait for a revision the cache has not reached: a
//! barrier read that never answers (a fresh one is sent beside it), no barrier read answering
//! at all (the fallback to etcd), `RequestProgress` paced while a read waits, a
//! serializable read at a revision only the cluster has (answered by etcd), and a read
//! racing close.

use std::time::Duration;

use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, task};

use super::*;
use crate::read::GetOptions;

/// A barrier read that never answers (a half-open connection to one endpoint) holds
/// up neither consistent reads nor watches from now: a fresh one is sent beside it.
#[tokio::test(start_paused = true)]
async fn a_hung_barrier_read_does_not_block_consistent_reads_or_watches() {
    let h = ready(config(), &["3.5.13"], &[(&k("a"), "1")], 10).await;
    h.up.hang_next_barrier_reads(1);
    let t0 = Instant::now();
    let r = within(h.cache.get(k("a"), None)).await.unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "answered after {:?}, not after the 3 s timeout",
        t0.elapsed()
    );
    for _ in 0..10 {
        let t = Instant::now();
        within(h.cache.get(k("a"), None)).await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
    }
    h.up.hang_next_barrier_reads(1);
    h.up.set_current_revision(12);
    let t = Instant::now();
    let mut w = h.cache.watch(k("a"), None).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        created(&mut w).await,
        12,
        "from the cluster's revision, not the cache's"
    );
    assert_eq!(h.up.fallbacks(), 0, "all from memory");
}

/// When no barrier read answers at all, a consistent read honours `ReadFallback::Etcd`.
#[tokio::test(start_paused = true)]
async fn a_consistent_read_falls_back_to_etcd_when_no_barrier_read_answers() {
    let h = ready(config(), &["3.5.13"], &[(&k("a"), "1")], 10).await;
    h.up.set_stalled(true);
    let r = within(h.cache.get(k("a"), None)).await.unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert_eq!(h.up.fallbacks(), 1);
}

/// While a read waits for a revision the cluster has not reached, `RequestProgress`
/// goes out once per `progress_request_interval`, not once per answer.
#[tokio::test(start_paused = true)]
async fn progress_requests_are_paced_while_a_read_waits_for_a_future_revision() {
    let cfg = Config {
        progress_request_interval: Duration::from_millis(100),
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut waiter = task::spawn(h.cache.wait_for_revision(100));
    assert_pending!(waiter.poll());
    settle().await;
    let mut answered = 0;
    for _ in 0..100 {
        // etcd answers every request at once, with a revision below the one awaited.
        while answered < h.up.requests() {
            h.watch.progress(10, true);
            answered += 1;
            settle().await;
        }
        advance(Duration::from_millis(10)).await;
        settle().await;
    }
    assert_pending!(waiter.poll());
    let sent = h.up.requests();
    assert!(
        (9..=12).contains(&sent),
        "{sent} requests in 1 s at a 100 ms interval"
    );
}

/// A serializable read at a revision the cluster has reached but the cache has not
/// (a quiet prefix on a server whose progress answers cannot be trusted) is answered
/// at once, by etcd, instead of timing out.
#[tokio::test(start_paused = true)]
async fn a_serializable_read_at_a_revision_only_the_cluster_has_is_answered() {
    let h = ready(config(), &["3.4.23"], &[(&k("a"), "1")], 10).await;
    h.up.set_current_revision(12);
    let t0 = Instant::now();
    let r = within(h.cache.get(
        k("a"),
        Some(GetOptions::new().with_serializable().with_revision(12)),
    ))
    .await
    .unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(h.up.fallbacks(), 1);
    // The same for the revision a watch from now was created at.
    h.up.set_current_revision(14);
    let mut w = h.cache.watch(k("a"), None).await.unwrap();
    let at = created(&mut w).await;
    assert_eq!(at, 14);
    let r = within(h.cache.get(
        k("a"),
        Some(GetOptions::new().with_serializable().with_revision(at)),
    ))
    .await
    .unwrap();
    assert_eq!(r.kvs().len(), 1);
}

/// A consistent read that is waiting when the cache closes returns `Closed`; it does
/// not fall back to etcd.
#[tokio::test(start_paused = true)]
async fn a_consistent_read_racing_close_returns_closed() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    h.up.set_current_revision(20);
    let mut read = task::spawn(h.cache.get(k("a"), None));
    assert_pending!(read.poll());
    settle().await;
    assert_pending!(read.poll());
    h.cache.close().await;
    let r = within(read).await;
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    assert_eq!(h.up.fallbacks(), 0);
}
