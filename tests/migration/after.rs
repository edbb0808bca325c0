use std::collections::{BTreeMap, HashMap, VecDeque};

use etcd_cache::{Cache, Error, EventType, GetOptions};
use etcd_cache::{WatchOptions, WatchResponse, WatchStream};

/// One change of one key, as the service's handlers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) key: String,
    /// `None` for a delete.
    pub(crate) value: Option<String>,
    pub(crate) prev: Option<String>,
    pub(crate) revision: i64,
}

/// The changes carried by one watch response.
fn changes(resp: &WatchResponse) -> Result<Vec<Change>, Error> {
    let mut out = Vec::new();
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        let value = match ev.event_type() {
            EventType::Put => Some(String::from_utf8_lossy(kv.value()).into_owned()),
            EventType::Delete => None,
        };
        let prev = ev
            .prev_kv()
            .map(|p| String::from_utf8_lossy(p.value()).into_owned());
        let (key, revision) = (kv.key_str()?.to_owned(), kv.mod_revision());
        out.push(Change {
            key,
            value,
            prev,
            revision,
        });
    }
    Ok(out)
}

/// Watches single keys, all of them multiplexed on one watch stream.
pub(crate) struct KeyWatcher {
    stream: WatchStream,
    /// Keys whose `created` response has not come yet, in request order.
    pending: VecDeque<String>,
    /// Watch id -> key, learned from the `created` responses.
    ids: HashMap<i64, String>,
    /// Header revisions of the progress responses received.
    pub(crate) progress: Vec<i64>,
}

impl KeyWatcher {
    pub(crate) async fn start(client: &mut Cache, first: &str) -> Result<KeyWatcher, Error> {
        let stream = client
            .watch(first, Some(WatchOptions::new().with_prev_key()))
            .await?;
        let pending = VecDeque::from([first.to_owned()]);
        Ok(KeyWatcher {
            stream,
            pending,
            ids: HashMap::new(),
            progress: Vec::new(),
        })
    }

    pub(crate) async fn add(&mut self, key: &str) -> Result<(), Error> {
        self.stream
            .watch(key, Some(WatchOptions::new().with_prev_key()))
            .await?;
        self.pending.push_back(key.to_owned());
        Ok(())
    }

    /// Cancels the watch of `key`; false if it is not watched (yet).
    pub(crate) async fn remove(&mut self, key: &str) -> Result<bool, Error> {
        let Some(id) = self.ids.iter().find(|(_, k)| *k == key).map(|(id, _)| *id) else {
            return Ok(false);
        };
        self.stream.cancel(id).await?;
        Ok(true)
    }

    pub(crate) async fn request_progress(&mut self) -> Result<(), Error> {
        self.stream.request_progress().await
    }

    /// The keys watched now, sorted.
    pub(crate) fn watching(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.ids.values().cloned().collect();
        keys.sort();
        keys
    }

    /// Handles the next response: the changes it carried (`None` once the stream ended).
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<Change>>, Error> {
        let Some(resp) = self.stream.message().await? else {
            return Ok(None);
        };
        let revision = resp.header().map_or(0, |h| h.revision());
        if resp.created() {
            let key = self.pending.pop_front().unwrap_or_default();
            self.ids.insert(resp.watch_id(), key);
        } else if resp.canceled() {
            self.ids.remove(&resp.watch_id());
        } else if resp.events().is_empty() {
            self.progress.push(revision);
        }
        Ok(Some(changes(&resp)?))
    }
}

/// Mirrors a prefix: lists it, then watches from the list's revision + 1, and lists it
/// again when the revision to resume from was compacted.
pub(crate) struct Mirror {
    client: Cache,
    prefix: String,
    pub(crate) kvs: BTreeMap<String, String>,
    /// Every change of every revision up to this one has been applied.
    pub(crate) revision: i64,
    pub(crate) changes: Vec<Change>,
    /// `(compact_revision, cancel_reason)` of each watch that forced a re-list.
    pub(crate) relists: Vec<(i64, String)>,
}

impl Mirror {
    pub(crate) fn new(client: Cache, prefix: &str) -> Mirror {
        let (kvs, changes, relists) = (BTreeMap::new(), Vec::new(), Vec::new());
        Mirror {
            client,
            prefix: prefix.to_owned(),
            kvs,
            revision: 0,
            changes,
            relists,
        }
    }

    async fn list(&mut self) -> Result<(), Error> {
        let opts = GetOptions::new().with_prefix();
        let resp = self.client.get(self.prefix.as_str(), Some(opts)).await?;
        self.kvs.clear();
        for kv in resp.kvs() {
            let value = String::from_utf8_lossy(kv.value()).into_owned();
            self.kvs.insert(kv.key_str()?.to_owned(), value);
        }
        self.revision = resp.header().map_or(0, |h| h.revision());
        Ok(())
    }

    /// Brings the mirror up to revision `until` (at least), resuming from where it was.
    pub(crate) async fn sync(&mut self, until: i64) -> Result<(), Error> {
        if self.revision == 0 {
            self.list().await?;
        }
        'watch: while self.revision < until {
            let opts = WatchOptions::new().with_prefix().with_prev_key();
            let opts = opts.with_start_revision(self.revision + 1);
            let mut stream = self.client.watch(self.prefix.as_str(), Some(opts)).await?;
            while self.revision < until {
                let Some(resp) = stream.message().await? else {
                    continue 'watch;
                };
                if resp.canceled() && resp.compact_revision() > 0 {
                    let reason = resp.cancel_reason().to_owned();
                    self.relists.push((resp.compact_revision(), reason));
                    self.list().await?;
                    continue 'watch;
                }
                for change in changes(&resp)? {
                    match &change.value {
                        Some(v) => self.kvs.insert(change.key.clone(), v.clone()),
                        None => self.kvs.remove(&change.key),
                    };
                    self.revision = change.revision;
                    self.changes.push(change);
                }
            }
        }
        Ok(())
    }
}
