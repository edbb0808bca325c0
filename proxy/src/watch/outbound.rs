//! The client's half of a Watch stream: its bounded queue (`--watch-send-queue`), and
//! etcd's fragments for the watches that asked for them.

use prost::Message;
use tokio::sync::mpsc;
use tonic::Status;

use super::id_map::IdSet;
use super::wire::WireResponse;
use crate::pb::etcdserverpb::WatchResponse;

/// The client's half of a Watch stream: its bounded queue, and which of its watches
/// asked for fragments.
pub(crate) struct Outbound {
    tx: mpsc::Sender<Result<WireResponse, Status>>,
    /// Watches created with `fragment`.
    fragment: IdSet,
    /// Fragment threshold (etcd's --max-request-bytes).
    max_request_bytes: usize,
}

impl Outbound {
    pub(crate) fn new(
        tx: mpsc::Sender<Result<WireResponse, Status>>,
        max_request_bytes: usize,
    ) -> Self {
        Outbound {
            tx,
            fragment: IdSet::default(),
            max_request_bytes,
        }
    }

    /// The queue itself (for the session's `select!`: room, closed).
    pub(crate) fn sender(&self) -> &mpsc::Sender<Result<WireResponse, Status>> {
        &self.tx
    }

    /// Whether watch `id` asked for fragments.
    pub(crate) fn fragments(&self, id: i64) -> bool {
        self.fragment.contains(&id)
    }

    /// Watch `id` asked for fragments.
    pub(crate) fn add_fragment(&mut self, id: i64) {
        self.fragment.insert(id);
    }

    /// Watch `id` ended.
    pub(crate) fn forget(&mut self, id: i64) {
        self.fragment.remove(&id);
    }

    /// Queues a response for the client (waits while the queue is full).
    pub(crate) async fn send(&self, resp: impl Into<WireResponse>) -> Result<(), ()> {
        self.tx.send(Ok(resp.into())).await.map_err(drop)
    }

    /// Ends the stream with `status`.
    pub(crate) async fn fail(&self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }

    /// Sends a response of a watch, in fragments if it asked for them.
    pub(crate) async fn emit(&self, resp: WireResponse) -> Result<(), ()> {
        match resp {
            WireResponse::Message(m) if self.fragments(m.watch_id) && m.events.len() > 1 => {
                for part in fragments(m, self.max_request_bytes) {
                    self.send(part).await?;
                }
                Ok(())
            }
            resp => self.send(resp).await,
        }
    }
}

/// etcd's `sendFragments`: a response of two or more events at or above `max_bytes` is
/// sent as several, each with `fragment = true` but the last.
fn fragments(resp: WatchResponse, max_bytes: usize) -> Vec<WatchResponse> {
    if resp.encoded_len() < max_bytes || resp.events.len() < 2 {
        return vec![resp];
    }
    let mut out = Vec::new();
    let mut events = resp.events.clone().into_iter().peekable();
    while events.peek().is_some() {
        let mut cur = WatchResponse {
            events: Vec::new(),
            fragment: true,
            ..resp.clone()
        };
        while let Some(ev) = events.peek() {
            cur.events.push(ev.clone());
            if cur.events.len() > 1 && cur.encoded_len() >= max_bytes {
                cur.events.pop();
                break;
            }
            events.next();
        }
        if events.peek().is_none() {
            cur.fragment = false;
        }
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::messages::test_put as put;

    #[test]
    fn fragments_split_as_etcd() {
        let resp = WatchResponse {
            watch_id: 3,
            events: (0..10).map(|i| put(&format!("k{i}"), 100)).collect(),
            ..Default::default()
        };
        // Below the limit: one response, not marked.
        let one = fragments(resp.clone(), 1 << 20);
        assert_eq!(one.len(), 1);
        assert!(!one[0].fragment);
        // Each event is ~110 bytes: at most 2 per part below 300 bytes.
        let parts = fragments(resp.clone(), 300);
        assert!(parts.len() >= 4, "{}", parts.len());
        assert!(parts[..parts.len() - 1].iter().all(|p| p.fragment));
        assert!(!parts.last().unwrap().fragment);
        let events: Vec<_> = parts.iter().flat_map(|p| p.events.clone()).collect();
        assert_eq!(events, resp.events);
        assert!(parts.iter().all(|p| p.watch_id == 3));
        // A single event is never split, whatever its size.
        let big = WatchResponse {
            events: vec![put("k", 1000)],
            ..Default::default()
        };
        assert_eq!(fragments(big, 10).len(), 1);
    }
}
