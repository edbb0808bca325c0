//! The one seam to etcd. Everything else in the crate speaks its own types, so the
//! follower logic can be driven by scripted responses in unit tests.

use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::error::{Error, Result};
use crate::get::GetResponse;
use crate::key_range::KeyRange;
use crate::kv::{EventType, KeyValue};

/// One message of the upstream watch, in the crate's terms.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// The watch was created.
    Created,
    /// Events, oldest first; several revisions may share one message.
    Events(Vec<(EventType, KeyValue)>),
    /// No events; every event up to `revision` was sent. `requested` is true for the
    /// answer to a stream-level `RequestProgress` (watch id -1), false for a per-watch
    /// periodic notification.
    Progress { revision: i64, requested: bool },
    /// The watch was cancelled; `compact_revision > 0` means the start revision was
    /// compacted.
    Canceled {
        compact_revision: i64,
        reason: String,
    },
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) revision: i64,
    pub(crate) kvs: Vec<KeyValue>,
    pub(crate) more: bool,
}

/// An open upstream watch.
pub(crate) trait UpstreamWatch: Send {
    /// The next message; `Ok(None)` when the stream ended. Cancel safe.
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>>;
    /// Sends a stream-level `RequestProgress`.
    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>>;
}

/// What the cache needs from etcd.
pub(crate) trait Upstream: Send + Sync + 'static {
    /// The server version of every endpoint that could be reached.
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>>;
    /// One page of `range` at `revision` (0: latest), at most `limit` keys.
    fn list_page(&self, range: KeyRange, revision: i64, limit: i64) -> BoxFuture<'_, Result<Page>>;
    /// Opens a watch on `range` from `start_revision` with progress notifications.
    fn watch(
        &self,
        range: KeyRange,
        start_revision: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>>;
    /// The cluster's current revision, by a linearizable count-only, limit-1 read of `range`.
    fn current_revision(&self, range: KeyRange) -> BoxFuture<'_, Result<i64>>;
    /// A read answered by etcd itself (the fallback of consistent reads).
    fn get(
        &self,
        key: Vec<u8>,
        options: etcd_client::GetOptions,
    ) -> BoxFuture<'_, Result<GetResponse>>;
}

/// True if this etcd version answers `RequestProgress` correctly (etcd#15220 fixed in
/// 3.4.25 / 3.5.8, etcd#17507 fixed in 3.4.31 / 3.5.13; Kubernetes gates on the latter).
pub(crate) fn version_trusts_progress(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

/// The production upstream: an `etcd_client::Client`.
pub(crate) struct EtcdUpstream {
    client: etcd_client::Client,
}

impl EtcdUpstream {
    pub(crate) fn new(client: etcd_client::Client) -> Self {
        EtcdUpstream { client }
    }
}

fn range_options(range: &KeyRange) -> (Vec<u8>, Vec<u8>) {
    (range.start.to_vec(), range.end.to_vec())
}

struct EtcdWatch {
    stream: etcd_client::WatchStream,
}

impl UpstreamWatch for EtcdWatch {
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>> {
        Box::pin(async move {
            let Some(resp) = self.stream.message().await? else {
                return Ok(None);
            };
            let mut pb = resp.0;
            let revision = pb.header.as_ref().map_or(0, |h| h.revision);
            // `canceled` first: etcd refuses a watch with `created` and `canceled` both set.
            Ok(Some(if pb.canceled {
                WatchMsg::Canceled {
                    compact_revision: pb.compact_revision,
                    reason: std::mem::take(&mut pb.cancel_reason),
                }
            } else if pb.created {
                WatchMsg::Created
            } else if pb.compact_revision != 0 {
                WatchMsg::Canceled {
                    compact_revision: pb.compact_revision,
                    reason: "compacted".into(),
                }
            } else if pb.events.is_empty() {
                WatchMsg::Progress {
                    revision,
                    requested: pb.watch_id == -1,
                }
            } else {
                let mut out = Vec::with_capacity(pb.events.len());
                for ev in std::mem::take(&mut pb.events) {
                    let t = match ev.r#type {
                        0 => EventType::Put,
                        1 => EventType::Delete,
                        other => {
                            return Err(Error::invalid(format!(
                                "etcd sent unknown event type {other}"
                            )))
                        }
                    };
                    let Some(kv) = ev.kv else {
                        return Err(Error::invalid("etcd sent an event without a key-value"));
                    };
                    out.push((t, KeyValue::from(kv)));
                }
                WatchMsg::Events(out)
            }))
        })
    }

    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { Ok(self.stream.request_progress().await?) })
    }
}

impl Upstream for EtcdUpstream {
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move {
            let mut client = self.client.clone();
            let mut versions = vec![client.status().await?.version().to_owned()];
            // Status on every member: the client may be balanced over several.
            let members = client.member_list().await?;
            let urls: Vec<String> = members
                .members()
                .iter()
                .flat_map(|m| m.client_urls().iter().cloned())
                .collect();
            let probes = urls.into_iter().map(|url| async move {
                let probe = async {
                    let opts = etcd_client::ConnectOptions::new()
                        .with_connect_timeout(Duration::from_secs(2))
                        .with_timeout(Duration::from_secs(2));
                    let mut c = etcd_client::Client::connect([url.as_str()], Some(opts)).await?;
                    Ok::<_, etcd_client::Error>(c.status().await?.version().to_owned())
                };
                match tokio::time::timeout(Duration::from_secs(3), probe).await {
                    Ok(Ok(v)) => v,
                    // Unknown (e.g. a TLS endpoint, which this plain probe cannot reach):
                    // counts as a version that cannot be trusted, which is only slower.
                    _ => format!("unreachable:{url}"),
                }
            });
            versions.extend(futures_util::future::join_all(probes).await);
            Ok(versions)
        })
    }

    fn list_page(&self, range: KeyRange, revision: i64, limit: i64) -> BoxFuture<'_, Result<Page>> {
        Box::pin(async move {
            let (key, end) = range_options(&range);
            let mut opts = etcd_client::GetOptions::new()
                .with_limit(limit)
                .with_revision(revision);
            if !end.is_empty() {
                opts = opts.with_range(end);
            }
            let resp = self.client.kv_client().get(key, Some(opts)).await?;
            let pb = resp.0;
            Ok(Page {
                revision: pb.header.as_ref().map_or(0, |h| h.revision),
                more: pb.more,
                kvs: pb.kvs.into_iter().map(KeyValue::from).collect(),
            })
        })
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>> {
        Box::pin(async move {
            let (key, end) = range_options(&range);
            let mut opts = etcd_client::WatchOptions::new()
                .with_start_revision(start_revision)
                .with_progress_notify();
            if !end.is_empty() {
                opts = opts.with_range(end);
            }
            let stream = self.client.watch_client().watch(key, Some(opts)).await?;
            Ok(Box::new(EtcdWatch { stream }) as Box<dyn UpstreamWatch>)
        })
    }

    fn current_revision(&self, range: KeyRange) -> BoxFuture<'_, Result<i64>> {
        Box::pin(async move {
            // The header revision is the cluster's, whatever the key: a count-only read
            // of one key costs O(log n) where a count over the prefix walks it (3.4).
            let opts = etcd_client::GetOptions::new()
                .with_count_only()
                .with_limit(1);
            let resp = self
                .client
                .kv_client()
                .get(range.start.to_vec(), Some(opts))
                .await?;
            Ok(resp.header().map_or(0, |h| h.revision()))
        })
    }

    fn get(
        &self,
        key: Vec<u8>,
        options: etcd_client::GetOptions,
    ) -> BoxFuture<'_, Result<GetResponse>> {
        Box::pin(async move {
            let resp = self.client.kv_client().get(key, Some(options)).await?;
            Ok(GetResponse::from_etcd(resp))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_versions_are_trusted() {
        for v in [
            "3.4.31", "3.4.38", "3.5.13", "3.5.21", "3.6.0", "3.6.5", "4.0.0", "v3.5.13",
        ] {
            assert!(version_trusts_progress(v), "{v}");
        }
        for v in [
            "3.4.23",
            "3.4.30",
            "3.5.8",
            "3.5.12",
            "3.3.27",
            "",
            "garbage",
            "unreachable:x",
        ] {
            assert!(!version_trusts_progress(v), "{v}");
        }
    }
}
