//! Typed reads at one revision: an index lookup holds exactly the view's objects at the
//! revision it reports, also when etcd answered its barrier at a revision the cache has
//! not applied; a list-watch's revision is that of the events it handed out, not a
//! header ahead of them (which the index task would publish as its state's revision).

use tokio_test::{assert_pending, task};

use super::*;
use crate::kv::KeyValue;
use crate::list_watch::ListWatchEvent;
use crate::typed::decode_with;
use crate::upstream::fake::{kv, put};

/// A view of the test prefix whose object is the value, indexed by it.
fn owners(cache: &Cache) -> crate::TypedView<String> {
    cache
        .typed(decode_with(|kv: &KeyValue| Ok(kv.value_str()?.to_owned())))
        .index("owner", |owner: &String| vec![owner.clone()])
        .build()
        .expect("view")
}

fn keys_of(list: &crate::TypedList<String>) -> Vec<String> {
    list.items()
        .iter()
        .map(|o| String::from_utf8_lossy(o.key()).into_owned())
        .collect()
}

/// etcd answers the lookup's barrier (progress answers are not trusted on 3.4.23) at
/// a revision whose change the cache's watch has not delivered yet: the answer reports
/// that revision and holds that change. (It reported etcd's revision with the index at
/// the cache's: `b`, written at 11, missing from an answer "at 11".)
#[tokio::test(start_paused = true)]
async fn an_index_lookup_answered_past_the_cache_holds_the_objects_of_its_revision() {
    let h = ready(config(), &["3.4.23"], &[(&k("a"), "x")], 10).await;
    let view = owners(&h.cache);
    let first = within(view.by_index("owner", "x")).await.unwrap();
    assert_eq!((first.revision(), keys_of(&first)), (10, vec![k("a")]));

    // etcd is at 11 with `b`; the cache's watch has not said so yet.
    h.up.set_kvs(
        vec![kv(&k("a"), "x", 2, 2, 1), kv(&k("b"), "x", 11, 11, 1)],
        11,
    );
    let got = within(view.by_index("owner", "x")).await.unwrap();
    assert_eq!(h.cache.revision(), 10, "the cache is still behind");
    assert_eq!(
        (got.revision(), keys_of(&got)),
        (11, vec![k("a"), k("b")]),
        "the view's objects at the revision the answer reports"
    );

    // Once the cache has it, the index answers, at the same revision.
    h.watch.events(vec![put(&k("b"), "x", 11, 11, 1)]);
    within(h.cache.wait_for_revision(11)).await.unwrap();
    let got = within(view.by_index("owner", "x")).await.unwrap();
    assert_eq!((got.revision(), keys_of(&got)), (11, vec![k("a"), k("b")]));
}

/// A list-watch that lists at 10 while the cache moves on to 12 before its watch from
/// 11 is registered: the watch's `created` header is 12, and so is the header of its
/// replay of 11. After handing out 11 the list-watch is at 11, not 12 (the index task
/// publishes this revision as its state's).
#[tokio::test(start_paused = true)]
async fn a_list_watch_is_at_the_revision_of_the_events_it_handed_out() {
    let h = ready(config(), &["3.5.13"], &[(&k("a"), "x")], 10).await;
    let mut lw = h.cache.list_watch(PREFIX).expect("list_watch");
    {
        // Lists at 10, then opens its watch from 11 (a compaction check first).
        let mut first = task::spawn(lw.next());
        assert_pending!(first.poll());
        settle().await;
        assert_pending!(first.poll());
        // Meanwhile the cache applies 11 and 12.
        h.watch.events(vec![put(&k("b"), "x", 11, 11, 1)]);
        h.watch.events(vec![put(&k("c"), "x", 12, 12, 1)]);
        within(h.cache.wait_for_revision(12)).await.unwrap();
        settle().await;
        let init = within(first).await.expect("an event").expect("no error");
        assert!(matches!(init, ListWatchEvent::Init { restarted: false }));
    }
    let mut handed = Vec::new();
    while handed.len() < 4 {
        let event = within(lw.next())
            .await
            .expect("an event")
            .expect("no error");
        let (name, revision) = match &event {
            ListWatchEvent::InitApply(kv) => ("init-apply", kv.mod_revision()),
            ListWatchEvent::InitDone { revision } => ("done", *revision),
            ListWatchEvent::Apply(kv) => ("apply", kv.mod_revision()),
            other => panic!("unexpected {other:?}"),
        };
        handed.push((name, revision, lw.revision()));
    }
    assert_eq!(
        handed,
        [
            ("init-apply", 2, None),
            ("done", 10, Some(10)),
            ("apply", 11, Some(11)),
            ("apply", 12, Some(12)),
        ]
    );
}
