//! The endpoints forwarded calls balance over: the set (`--endpoints`, kept to etcd's
//! members by `--endpoints-auto-sync-interval`: `auto_sync.rs`), those taken out because
//! they refuse connections, a channel to each on its own, and the hedged calls that use
//! them.

use std::future::Future;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use super::dial::Dial;
use crate::error::Result;

/// Room for endpoint changes queued toward the balanced channel.
const ENDPOINT_CHANGES: usize = 64;

/// How often `Upstream::spawn_reachability` tries each endpoint.
pub(super) const REACHABILITY_INTERVAL: Duration = Duration::from_secs(1);

/// How long a hedged call (`Upstream::hedged`) waits on the member the balance
/// picked before it asks every member on a connection of its own.
pub(super) const HEDGE_AFTER: Duration = Duration::from_millis(150);

/// The endpoints the forwarding channel balances over, by URL.
pub(super) struct Endpoints {
    dial: Dial,
    /// Guards the set as last sent to `changes` (taken briefly, never across an await).
    current: Mutex<Vec<String>>,
    changes: mpsc::Sender<Change<String, Endpoint>>,
    /// The set after each change, for the cache's own client
    /// (`Upstream::endpoint_changes`).
    published: tokio::sync::watch::Sender<Vec<String>>,
    /// Endpoints of `current` taken out of the balance because they refuse connections
    /// (`Upstream::spawn_reachability`).
    down: Mutex<std::collections::HashSet<String>>,
    /// A channel to each endpoint of `current` on its own, dialed lazily when a hedged
    /// call (`Upstream::hedged`) first needs it.
    pinned: Mutex<std::collections::HashMap<String, Channel>>,
}

impl Endpoints {
    /// The balanced channel over `urls`, dialed lazily, and the set.
    pub(super) fn new(dial: Dial, urls: Vec<String>) -> Result<(Channel, Endpoints)> {
        let (channel, changes) = Channel::balance_channel(ENDPOINT_CHANGES.max(urls.len()));
        for url in &urls {
            let change = Change::Insert(url.clone(), dial.endpoint(url)?);
            changes.try_send(change).expect("room for every endpoint");
        }
        let endpoints = Endpoints {
            dial,
            current: Mutex::new(urls.clone()),
            changes,
            published: tokio::sync::watch::Sender::new(urls),
            down: Mutex::default(),
            pinned: Mutex::default(),
        };
        Ok((channel, endpoints))
    }

    /// The endpoints forwarded calls balance over.
    pub(super) fn current(&self) -> Vec<String> {
        self.current.lock().clone()
    }

    /// Makes `urls` the endpoints forwarded calls balance over: those not among them are
    /// dropped (their connections close once idle), new ones are dialed lazily. Returns
    /// the added and the removed. A URL that is not an endpoint (bad syntax) is left out,
    /// logged.
    pub(super) async fn set(&self, urls: &[String]) -> (Vec<String>, Vec<String>) {
        let (added, removed) = {
            let mut current = self.current.lock();
            let added: Vec<String> = urls
                .iter()
                .filter(|u| !current.contains(u))
                .cloned()
                .collect();
            let removed: Vec<String> = current
                .iter()
                .filter(|u| !urls.contains(u))
                .cloned()
                .collect();
            current.retain(|u| urls.contains(u));
            current.extend(added.iter().cloned());
            self.down.lock().retain(|u| !removed.contains(u));
            self.pinned.lock().retain(|u, _| !removed.contains(u));
            (added, removed)
        };
        let mut inserted = Vec::new();
        for url in added {
            match self.dial.endpoint(&url) {
                Ok(ep) => {
                    let _ = self.changes.send(Change::Insert(url.clone(), ep)).await;
                    inserted.push(url);
                }
                Err(e) => {
                    self.current.lock().retain(|u| *u != url);
                    tracing::warn!(endpoint = %url, error = %e, "not an endpoint; left out");
                }
            }
        }
        for url in &removed {
            let _ = self.changes.send(Change::Remove(url.clone())).await;
        }
        if !inserted.is_empty() || !removed.is_empty() {
            self.publish();
        }
        (inserted, removed)
    }

    /// Tells the cache's client the endpoints calls balance over now: those of `current`
    /// that do not refuse connections (all of them when every one does).
    fn publish(&self) {
        let current = self.current();
        let down = self.down.lock().clone();
        let up: Vec<String> = current
            .iter()
            .filter(|u| !down.contains(*u))
            .cloned()
            .collect();
        let now = if up.is_empty() { current } else { up };
        self.published.send_if_modified(|old| {
            let changed = *old != now;
            *old = now;
            changed
        });
    }

    /// The published set from now on (`Upstream::endpoint_changes`).
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<Vec<String>> {
        self.published.subscribe()
    }

    /// Tries a TCP connection to each endpoint: one that refuses it leaves the balance,
    /// one that accepts again comes back (see `Upstream::spawn_reachability`).
    pub(super) async fn check_reachability(&self) {
        let urls = self.current();
        // With one endpoint there is nothing to route around: no probe.
        if urls.len() < 2 && self.down.lock().is_empty() {
            return;
        }
        let mut reachable = Vec::with_capacity(urls.len());
        for url in &urls {
            reachable.push(connects(url).await);
        }
        let any_up = reachable.iter().any(|r| *r);
        let mut moved = false;
        for (url, ok) in urls.iter().zip(reachable) {
            let was_down = self.down.lock().contains(url);
            if !ok && any_up && !was_down {
                self.down.lock().insert(url.clone());
                let _ = self.changes.send(Change::Remove(url.clone())).await;
                tracing::warn!(endpoint = %url, "etcd endpoint refuses connections: forwarded calls and the cache avoid it until it accepts again");
                moved = true;
            } else if was_down && (ok || !any_up) {
                let Ok(ep) = self.dial.endpoint(url) else {
                    continue;
                };
                self.down.lock().remove(url);
                let _ = self.changes.send(Change::Insert(url.clone(), ep)).await;
                tracing::info!(endpoint = %url, "etcd endpoint back in the balance");
                moved = true;
            }
        }
        if moved {
            self.publish();
        }
    }

    /// The hedged call of `Upstream::hedged`, `balanced` the
    /// channel over every endpoint.
    pub(super) async fn hedged<R, Fut>(
        &self,
        balanced: &Channel,
        one: impl Fn(Channel) -> Fut,
    ) -> Result<R, Status>
    where
        Fut: Future<Output = Result<R, Status>>,
    {
        use futures::StreamExt;
        let mut calls = futures::stream::FuturesUnordered::new();
        calls.push(one(balanced.clone()));
        let hedge = tokio::time::sleep(HEDGE_AFTER);
        tokio::pin!(hedge);
        let mut hedged = false;
        let mut unsettled = None;
        loop {
            let go_wide = tokio::select! {
                Some(answer) = calls.next() => {
                    if settled(&answer) {
                        return answer;
                    }
                    unsettled.get_or_insert(answer);
                    !hedged
                }
                () = &mut hedge, if !hedged => true,
            };
            if go_wide {
                hedged = true;
                let wide = self.pinned_channels();
                if !wide.is_empty() {
                    crate::metrics::get().hedged();
                }
                for channel in wide {
                    calls.push(one(channel));
                }
            }
            if calls.is_empty() {
                if let Some(answer) = unsettled {
                    return answer;
                }
            }
        }
    }

    /// A channel to each endpoint on its own (those that refuse connections left out),
    /// dialed lazily; none with fewer than two endpoints (nothing else to ask).
    fn pinned_channels(&self) -> Vec<Channel> {
        let urls = self.current();
        if urls.len() < 2 {
            return Vec::new();
        }
        let down = self.down.lock().clone();
        let mut pinned = self.pinned.lock();
        urls.iter()
            .filter(|u| !down.contains(*u))
            .filter_map(|url| {
                if let Some(c) = pinned.get(url) {
                    return Some(c.clone());
                }
                let channel = self.dial.endpoint(url).ok()?.connect_lazy();
                pinned.insert(url.clone(), channel.clone());
                Some(channel)
            })
            .collect()
    }
}

/// Whether a TCP connection to `url`'s host and port opens within a second.
async fn connects(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return true;
    };
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
        return true;
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((host.as_str(), port))
        )
        .await,
        Ok(Ok(_))
    )
}

/// Whether an answer settles a hedged call (`Upstream::hedged`): anything but a failure
/// that another member may not have (unreachable, timed out, leader lost, connection
/// broken).
fn settled<R>(answer: &Result<R, Status>) -> bool {
    !matches!(answer, Err(s) if matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown
    ))
}
