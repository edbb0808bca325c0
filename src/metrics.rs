//! Metrics through the `metrics` facade (feature `metrics`; the user installs the
//! exporter, e.g. `metrics-exporter-prometheus`). Without the feature every call here is
//! an empty inline function: zero cost.
//!
//! Handles are registered once per cache (labelled `cache=<prefix>`), so recording is an
//! atomic add in the exporter, never a registry lookup; the hot paths record once per
//! upstream message or per catch-up, not per delivery. Names, units and labels are
//! listed in `docs/METRICS.md`.

#[cfg(feature = "metrics")]
mod enabled {
    use metrics::{Counter, Gauge, Histogram};

    /// Every handle of one cache.
    pub(crate) struct Handles {
        pub(crate) events_received: Counter,
        pub(crate) revisions_applied: Counter,
        pub(crate) deliveries: Counter,
        pub(crate) replayed: Counter,
        pub(crate) responses_events: Counter,
        pub(crate) responses_progress: Counter,
        pub(crate) watchers: Gauge,
        pub(crate) lagging: Gauge,
        pub(crate) lagging_started: Counter,
        pub(crate) watches_opened: Counter,
        pub(crate) ended_dropped: Counter,
        pub(crate) ended_canceled: Counter,
        pub(crate) ended_compacted: Counter,
        pub(crate) ended_closed: Counter,
        pub(crate) ended_failed: Counter,
        pub(crate) refused_limit: Counter,
        pub(crate) watch_creation: Histogram,
        pub(crate) history_revisions: Gauge,
        pub(crate) history_bytes: Gauge,
        pub(crate) store_keys: Gauge,
        pub(crate) store_bytes: Gauge,
        pub(crate) revision: Gauge,
        pub(crate) cluster_revision: Gauge,
        pub(crate) behind: Gauge,
        pub(crate) last_message: Gauge,
        pub(crate) connects: Counter,
        pub(crate) disconnect_transport: Counter,
        pub(crate) disconnect_protocol: Counter,
        pub(crate) disconnect_upstream: Counter,
        pub(crate) disconnect_compacted: Counter,
        pub(crate) disconnect_data_frames: Counter,
        pub(crate) relists: Counter,
        pub(crate) list_pages: Counter,
        pub(crate) progress_requests: Counter,
        pub(crate) progress_answers_used: Counter,
        pub(crate) progress_answers_ignored: Counter,
        pub(crate) reads_memory: Counter,
        pub(crate) reads_etcd: Counter,
        pub(crate) read_wait: Histogram,
        pub(crate) consistency_checks: Counter,
        pub(crate) consistency_mismatches: Counter,
    }

    impl Handles {
        pub(crate) fn new(cache: String) -> Self {
            let c = |name: &'static str| metrics::counter!(name, "cache" => cache.clone());
            let cl = |name: &'static str, k: &'static str, v: &'static str| metrics::counter!(name, "cache" => cache.clone(), k => v);
            let g = |name: &'static str| metrics::gauge!(name, "cache" => cache.clone());
            let h = |name: &'static str| metrics::histogram!(name, "cache" => cache.clone());
            Handles {
                events_received: c("etcd_cache_upstream_events_total"),
                revisions_applied: c("etcd_cache_upstream_revisions_total"),
                deliveries: c("etcd_cache_deliveries_total"),
                replayed: c("etcd_cache_replayed_total"),
                responses_events: cl("etcd_cache_watch_responses_total", "kind", "events"),
                responses_progress: cl("etcd_cache_watch_responses_total", "kind", "progress"),
                watchers: g("etcd_cache_watchers"),
                lagging: g("etcd_cache_watchers_lagging"),
                lagging_started: c("etcd_cache_lagging_total"),
                watches_opened: c("etcd_cache_watches_opened_total"),
                ended_dropped: cl("etcd_cache_watches_ended_total", "reason", "dropped"),
                ended_canceled: cl("etcd_cache_watches_ended_total", "reason", "canceled"),
                ended_compacted: cl("etcd_cache_watches_ended_total", "reason", "compacted"),
                ended_closed: cl("etcd_cache_watches_ended_total", "reason", "closed"),
                ended_failed: cl("etcd_cache_watches_ended_total", "reason", "failed"),
                refused_limit: cl("etcd_cache_watches_refused_total", "reason", "limit"),
                watch_creation: h("etcd_cache_watch_creation_seconds"),
                history_revisions: g("etcd_cache_history_revisions"),
                history_bytes: g("etcd_cache_history_bytes"),
                store_keys: g("etcd_cache_store_keys"),
                store_bytes: g("etcd_cache_store_bytes"),
                revision: g("etcd_cache_revision"),
                cluster_revision: g("etcd_cache_cluster_revision"),
                behind: g("etcd_cache_behind_revisions"),
                last_message: g("etcd_cache_upstream_last_message_timestamp_seconds"),
                connects: c("etcd_cache_upstream_connects_total"),
                disconnect_transport: cl(
                    "etcd_cache_upstream_disconnects_total",
                    "cause",
                    "transport",
                ),
                disconnect_protocol: cl(
                    "etcd_cache_upstream_disconnects_total",
                    "cause",
                    "protocol",
                ),
                disconnect_upstream: cl("etcd_cache_upstream_disconnects_total", "cause", "etcd"),
                disconnect_data_frames: cl(
                    "etcd_cache_upstream_disconnects_total",
                    "cause",
                    "too_many_data_frames",
                ),
                disconnect_compacted: cl(
                    "etcd_cache_upstream_disconnects_total",
                    "cause",
                    "compacted",
                ),
                relists: c("etcd_cache_relists_total"),
                list_pages: c("etcd_cache_list_pages_total"),
                progress_requests: c("etcd_cache_progress_requests_total"),
                progress_answers_used: cl("etcd_cache_progress_answers_total", "used", "true"),
                progress_answers_ignored: cl("etcd_cache_progress_answers_total", "used", "false"),
                reads_memory: cl("etcd_cache_consistent_reads_total", "served", "memory"),
                reads_etcd: cl("etcd_cache_consistent_reads_total", "served", "etcd"),
                read_wait: h("etcd_cache_consistent_read_wait_seconds"),
                consistency_checks: c("etcd_cache_consistency_checks_total"),
                consistency_mismatches: c("etcd_cache_consistency_mismatches_total"),
            }
        }
    }
}

use std::time::Duration;

/// Why a watch ended, for `etcd_cache_watches_ended_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    Dropped,
    Canceled,
    Compacted,
    Closed,
    Failed,
}

/// Why a session ended, for `etcd_cache_upstream_disconnects_total{cause}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Transport,
    Protocol,
    Etcd,
    Compacted,
    /// The client's own h2 closed the connection: too many small DATA frames unread.
    TooManyDataFrames,
}

/// One cache's metrics.
pub(crate) struct Metrics {
    #[cfg(feature = "metrics")]
    h: enabled::Handles,
}

macro_rules! record {
    ($self:ident, $body:expr) => {{
        #[cfg(feature = "metrics")]
        {
            let h = &$self.h;
            $body(h)
        }
    }};
}

#[allow(unused_variables)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Metrics {
    pub(crate) fn new(prefix: &[u8]) -> Self {
        Metrics {
            #[cfg(feature = "metrics")]
            h: enabled::Handles::new(String::from_utf8_lossy(prefix).into_owned()),
        }
    }

    /// One upstream message applied: `events` events in `revisions` revisions,
    /// `deliveries` pushed to mailboxes.
    #[inline]
    pub(crate) fn applied(&self, events: usize, revisions: usize, deliveries: usize) {
        record!(self, |h: &enabled::Handles| {
            h.events_received.increment(events as u64);
            h.revisions_applied.increment(revisions as u64);
            h.deliveries.increment(deliveries as u64);
            h.responses_events.increment(deliveries as u64);
        })
    }

    /// Takes the deliveries catch-ups from the history have queued since the last call
    /// (a plain load when there are none: consumers call it on every poll).
    #[inline]
    pub(crate) fn replayed(&self, lag: &crate::subscribers::mailbox::LagCount) {
        #[cfg(feature = "metrics")]
        {
            let n = lag.take_replayed();
            if n > 0 {
                self.h.replayed.increment(n as u64);
                self.h.responses_events.increment(n as u64);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = lag;
    }

    #[inline]
    pub(crate) fn progress_response(&self) {
        record!(self, |h: &enabled::Handles| h
            .responses_progress
            .increment(1))
    }

    #[inline]
    pub(crate) fn watchers(&self, open: usize) {
        record!(self, |h: &enabled::Handles| h.watchers.set(open as f64))
    }

    #[inline]
    pub(crate) fn lagging(&self, lagging: usize, started: bool) {
        record!(self, |h: &enabled::Handles| {
            h.lagging.set(lagging as f64);
            if started {
                h.lagging_started.increment(1);
            }
        })
    }

    #[inline]
    pub(crate) fn watch_opened(&self, took: Duration) {
        record!(self, |h: &enabled::Handles| {
            h.watches_opened.increment(1);
            h.watch_creation.record(took.as_secs_f64());
        })
    }

    #[inline]
    pub(crate) fn watch_ended(&self, reason: EndReason) {
        record!(self, |h: &enabled::Handles| match reason {
            EndReason::Dropped => h.ended_dropped.increment(1),
            EndReason::Canceled => h.ended_canceled.increment(1),
            EndReason::Compacted => h.ended_compacted.increment(1),
            EndReason::Closed => h.ended_closed.increment(1),
            EndReason::Failed => h.ended_failed.increment(1),
        })
    }

    #[inline]
    pub(crate) fn watch_refused(&self) {
        record!(self, |h: &enabled::Handles| h.refused_limit.increment(1))
    }

    /// The published state after a change: revision, store and history sizes, and how
    /// far behind the cluster the cache is.
    #[inline]
    pub(crate) fn published(
        &self,
        revision: i64,
        keys: usize,
        store_bytes: usize,
        history: (usize, usize),
        cluster_revision: i64,
    ) {
        record!(self, |h: &enabled::Handles| {
            h.revision.set(revision as f64);
            h.store_keys.set(keys as f64);
            h.store_bytes.set(store_bytes as f64);
            h.history_revisions.set(history.0 as f64);
            h.history_bytes.set(history.1 as f64);
            let cluster = cluster_revision.max(revision);
            h.cluster_revision.set(cluster as f64);
            h.behind.set((cluster - revision) as f64);
        })
    }

    /// The follower heard from etcd now.
    #[inline]
    pub(crate) fn heard(&self) {
        record!(self, |h: &enabled::Handles| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            h.last_message.set(now.as_secs_f64());
        })
    }

    #[inline]
    pub(crate) fn connected(&self) {
        record!(self, |h: &enabled::Handles| h.connects.increment(1))
    }

    #[inline]
    pub(crate) fn disconnected(&self, cause: Cause) {
        record!(self, |h: &enabled::Handles| match cause {
            Cause::Transport => h.disconnect_transport.increment(1),
            Cause::Protocol => h.disconnect_protocol.increment(1),
            Cause::Etcd => h.disconnect_upstream.increment(1),
            Cause::Compacted => h.disconnect_compacted.increment(1),
            Cause::TooManyDataFrames => h.disconnect_data_frames.increment(1),
        })
    }

    #[inline]
    pub(crate) fn listed(&self, pages: usize, first: bool) {
        record!(self, |h: &enabled::Handles| {
            h.list_pages.increment(pages as u64);
            if !first {
                h.relists.increment(1);
            }
        })
    }

    #[inline]
    pub(crate) fn progress_requested(&self) {
        record!(self, |h: &enabled::Handles| h
            .progress_requests
            .increment(1))
    }

    #[inline]
    pub(crate) fn progress_answered(&self, used: bool) {
        record!(self, |h: &enabled::Handles| if used {
            h.progress_answers_used.increment(1)
        } else {
            h.progress_answers_ignored.increment(1)
        })
    }

    /// A consistent read done: from memory or by etcd, after `waited`.
    #[inline]
    pub(crate) fn consistent_read(&self, from_memory: bool, waited: Duration) {
        record!(self, |h: &enabled::Handles| {
            if from_memory {
                h.reads_memory.increment(1)
            } else {
                h.reads_etcd.increment(1)
            }
            h.read_wait.record(waited.as_secs_f64());
        })
    }

    #[inline]
    pub(crate) fn consistency_checked(&self, mismatch: bool) {
        record!(self, |h: &enabled::Handles| {
            h.consistency_checks.increment(1);
            if mismatch {
                h.consistency_mismatches.increment(1);
            }
        })
    }
}

/// One typed view's metrics (`etcd_cache_typed_decodes_total` and
/// `etcd_cache_typed_decode_failures_total`, labelled with the cache and the view's
/// prefix).
pub(crate) struct ViewMetrics {
    #[cfg(feature = "metrics")]
    decodes: metrics::Counter,
    #[cfg(feature = "metrics")]
    failures: metrics::Counter,
}

#[allow(unused_variables)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl ViewMetrics {
    pub(crate) fn new(cache: &[u8], view: &[u8]) -> Self {
        #[cfg(feature = "metrics")]
        {
            let cache = String::from_utf8_lossy(cache).into_owned();
            let view = String::from_utf8_lossy(view).into_owned();
            ViewMetrics {
                decodes: metrics::counter!("etcd_cache_typed_decodes_total", "cache" => cache.clone(), "view" => view.clone()),
                failures: metrics::counter!("etcd_cache_typed_decode_failures_total", "cache" => cache, "view" => view),
            }
        }
        #[cfg(not(feature = "metrics"))]
        ViewMetrics {}
    }

    /// One value decoded (`ok` false: the codec refused it).
    #[inline]
    pub(crate) fn decoded(&self, ok: bool) {
        #[cfg(feature = "metrics")]
        {
            self.decodes.increment(1);
            if !ok {
                self.failures.increment(1);
            }
        }
    }
}
