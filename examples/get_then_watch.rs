//! Get-then-watch with a re-list on compaction: the loop every etcd mirror runs, on the
//! cache.
//!
//! ```text
//! cargo run --example get_then_watch                          # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example get_then_watch
//! ```
//!
//! A mirror lists a prefix (`get` with `with_prefix`), watches it from the list's header
//! revision + 1, and applies the events to a local map. When the watch answers with
//! `canceled() && compact_revision() > 0` the revision it resumed from is gone, and it
//! lists again and watches from there: the same branch as on etcd, where the cause is
//! etcd's compaction; on the cache it is the history window (`history_window`).
//!
//! The scenario: the mirror follows a few writes, then stops reading while a burst of
//! writes overflows its buffer (`subscriber_buffer`) and the cache's window, so its watch
//! is canceled as compacted when it reads again. It re-lists once and follows on. At the
//! end its map must equal etcd's own answer (a direct `etcd_client` read) and it must
//! have re-listed exactly once; else the example exits with 1.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use etcd_cache::{Cache, EventType, GetOptions, WatchOptions, WatchStream};

/// The cache keeps this many revisions; the burst writes more.
const WINDOW: usize = 16;

/// A local copy of a prefix, kept current by one watch.
struct Mirror {
    cache: Cache,
    prefix: String,
    kvs: BTreeMap<String, String>,
    /// Every event up to this revision is applied.
    revision: i64,
    relists: usize,
}

impl Mirror {
    /// Lists the prefix and watches it from the list's revision + 1.
    async fn list_and_watch(&mut self) -> etcd_cache::Result<WatchStream> {
        let list = self
            .cache
            .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        self.kvs.clear();
        for kv in list.kvs() {
            self.kvs
                .insert(kv.key_str()?.to_owned(), kv.value_str()?.to_owned());
        }
        self.revision = list.header().map_or(0, |h| h.revision());
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.revision + 1);
        self.cache.watch(self.prefix.as_str(), Some(opts)).await
    }

    /// Reads the watch until the mirror has applied `until`, re-listing when the watch
    /// is canceled as compacted.
    async fn follow(&mut self, stream: &mut WatchStream, until: i64) -> etcd_cache::Result<()> {
        while self.revision < until {
            let Some(resp) = stream.message().await? else {
                *stream = self.list_and_watch().await?;
                continue;
            };
            if resp.canceled() && resp.compact_revision() > 0 {
                println!(
                    "  watch canceled at revision {}: {} (the cache serves from {}); re-listing",
                    self.revision,
                    resp.cancel_reason(),
                    resp.compact_revision()
                );
                self.relists += 1;
                *stream = self.list_and_watch().await?;
                continue;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = kv.key_str()?.to_owned();
                match ev.event_type() {
                    EventType::Put => self.kvs.insert(key, kv.value_str()?.to_owned()),
                    EventType::Delete => self.kvs.remove(&key),
                };
                self.revision = kv.mod_revision();
            }
        }
        Ok(())
    }
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut client = testkit::Connect::new().try_client(&endpoints).await?;
    let prefix = testkit::unique_prefix("get-then-watch");
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        .history_window(WINDOW)
        .subscriber_buffer(4)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_ready_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let put = |i: usize| (format!("{prefix}key-{}", i % 5), format!("v{i}"));

    for i in 0..3 {
        let (k, v) = put(i);
        client.put(k, v, None).await.map_err(|e| e.to_string())?;
    }
    let mut mirror = Mirror {
        cache: cache.clone(),
        prefix: prefix.clone(),
        kvs: BTreeMap::new(),
        revision: 0,
        relists: 0,
    };
    let mut stream = mirror.list_and_watch().await.map_err(|e| e.to_string())?;
    println!(
        "listed {} keys at revision {}",
        mirror.kvs.len(),
        mirror.revision
    );

    // Follow a few writes.
    let mut last = 0;
    for i in 3..8 {
        let (k, v) = put(i);
        last = revision(
            client
                .put(k, v, None)
                .await
                .map_err(|e| e.to_string())?
                .header(),
        );
    }
    last = revision(
        client
            .delete(format!("{prefix}key-0"), None)
            .await
            .map_err(|e| e.to_string())?
            .header(),
    )
    .max(last);
    mirror
        .follow(&mut stream, last)
        .await
        .map_err(|e| e.to_string())?;
    println!("followed to revision {}", mirror.revision);

    // A burst while the mirror does not read: more than its buffer and the window.
    for i in 8..(8 + 3 * WINDOW) {
        let (k, v) = put(i);
        last = revision(
            client
                .put(k, v, None)
                .await
                .map_err(|e| e.to_string())?
                .header(),
        );
    }
    println!(
        "burst of {} writes to revision {last} while the mirror was not reading",
        3 * WINDOW
    );
    cache
        .wait_for_revision(last)
        .await
        .map_err(|e| e.to_string())?;
    mirror
        .follow(&mut stream, last)
        .await
        .map_err(|e| e.to_string())?;

    // And after the re-list, live again.
    let (k, v) = put(1000);
    last = revision(
        client
            .put(k, v, None)
            .await
            .map_err(|e| e.to_string())?
            .header(),
    );
    mirror
        .follow(&mut stream, last)
        .await
        .map_err(|e| e.to_string())?;

    // Check against etcd itself.
    let truth = client
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let truth: BTreeMap<String, String> = truth
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect();
    cache.close().await;
    if mirror.kvs != truth {
        return Err(format!(
            "the mirror differs from etcd:\n  mirror {:?}\n  etcd   {truth:?}",
            mirror.kvs
        ));
    }
    if mirror.relists != 1 {
        return Err(format!("expected one re-list, saw {}", mirror.relists));
    }
    println!(
        "OK: the mirror equals etcd ({} keys at revision {}) after {} re-list",
        mirror.kvs.len(),
        mirror.revision,
        mirror.relists
    );
    Ok(())
}

fn revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

fn main() -> ExitCode {
    testkit::example_main("get_then_watch", Duration::from_secs(30), run)
}
