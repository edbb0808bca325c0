//! etcd's compaction, followed: a read or a watch at a revision etcd compacted behind
//! the cache's back is refused with etcd's compact revision although the window still
//! holds it; with `follow_etcd_compaction(false)` the window alone decides.

use std::sync::atomic::Ordering::SeqCst;

use super::*;
use crate::read::GetOptions;
use crate::upstream::fake::put;

/// A cache at revision 15 whose window holds revisions 11 to 15 (one put each), over an
/// etcd that compacted up to 13.
async fn compacted_at_13(cfg: Config) -> Harness {
    let h = ready(cfg, &["3.6.0"], &[], 10).await;
    for rev in 11..=15 {
        h.watch.events(vec![put(&k("a"), "v", 11, rev, rev - 10)]);
    }
    within(h.cache.wait_for_revision(15)).await.unwrap();
    h.up.set_current_revision(15);
    h.up.compact(13);
    h
}

/// A watch of the test key from `revision`, past its `created` response.
async fn watch_from(cache: &Cache, revision: i64) -> WatchStream {
    let opts = WatchOptions::new().with_start_revision(revision);
    let mut w = cache.watch(k("a"), Some(opts)).await.unwrap();
    created(&mut w).await;
    w
}

fn at(revision: i64) -> Option<GetOptions> {
    Some(GetOptions::new().with_revision(revision))
}

#[tokio::test(start_paused = true)]
async fn reads_and_watches_below_etcds_compaction_are_refused_as_etcd_refuses_them() {
    let h = compacted_at_13(config()).await;
    assert!(matches!(
        h.cache.get(k("a"), at(12)).await,
        Err(Error::Compacted {
            compact_revision: 13
        })
    ));
    // At the compact revision etcd still answers, and so does the cache.
    let r = h.cache.get(k("a"), at(13)).await.unwrap();
    assert_eq!(r.kvs()[0].mod_revision(), 13);
    // Learned: a serializable read below it is refused without asking etcd again.
    let asked = h.up.compaction_checks.load(SeqCst);
    let serializable = GetOptions::new().with_revision(11).with_serializable();
    assert!(matches!(
        h.cache.get(k("a"), Some(serializable)).await,
        Err(Error::Compacted {
            compact_revision: 13
        })
    ));
    assert_eq!(h.up.compaction_checks.load(SeqCst), asked);

    let mut w = watch_from(&h.cache, 12).await;
    assert_eq!(is_compacted(&next(&mut w).await), Some(13));
    let mut w = watch_from(&h.cache, 13).await;
    assert_eq!(
        next_rev(&mut w).await,
        13,
        "replayed from the compact revision"
    );
    assert_eq!(h.cache.compacted(12).await.unwrap(), Some(13));
    assert_eq!(h.cache.compacted(13).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_serializable_read_learns_of_a_compaction_within_the_check_interval() {
    let h = compacted_at_13(config()).await;
    let serializable = || Some(GetOptions::new().with_revision(12).with_serializable());
    // Nothing asked etcd yet: the window answers (as a lagging etcd member would).
    assert!(h.cache.get(k("a"), serializable()).await.is_ok());
    tokio::time::sleep(crate::compaction::CHECK_INTERVAL * 2).await;
    assert!(matches!(
        h.cache.get(k("a"), serializable()).await,
        Err(Error::Compacted {
            compact_revision: 13
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn without_following_etcds_compaction_the_window_decides() {
    let cfg = Config {
        follow_etcd_compaction: false,
        ..config()
    };
    let h = compacted_at_13(cfg).await;
    let r = h.cache.get(k("a"), at(12)).await.unwrap();
    assert_eq!(r.kvs()[0].mod_revision(), 12);
    let mut w = watch_from(&h.cache, 12).await;
    assert_eq!(next_rev(&mut w).await, 12);
    tokio::time::sleep(crate::compaction::CHECK_INTERVAL * 2).await;
    assert_eq!(
        h.up.compaction_checks.load(SeqCst),
        0,
        "etcd was never asked"
    );
    // Asked explicitly, it still knows.
    assert_eq!(h.cache.compacted(12).await.unwrap(), Some(13));
}
