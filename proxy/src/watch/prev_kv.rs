//! The prev_kv etcd leaves out of a forwarded watch's events. etcd registers a watch
//! before it records that the watch wants prev_kv (`serverWatchStream.recvLoop`:
//! `watchStream.Watch`, then `prevKV[id] = true`), so events its send loop picks up in
//! between come without it. The proxy fills those in as etcd's send loop would have:
//! the key at the event's revision - 1, read from etcd.

use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::etcd_errors;
use crate::forward_macros::call_upstream;
use crate::pb::etcdserverpb::{RangeRequest, WatchResponse};
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::KeyValue;
use crate::upstream::Upstream;

/// The pause before each read of a prev_kv etcd left out (the first at once).
const FILL_PAUSES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(200),
];
/// How often a prev_kv etcd left out is asked for before the client's stream ends.
const FILL_ATTEMPTS: usize = FILL_PAUSES.len();
/// How long one read of a prev_kv etcd left out may take (a blackholed connection
/// answers nothing).
const FILL_TIMEOUT: Duration = Duration::from_secs(2);

/// Fills in the prev_kv etcd left out of `resp`'s events (of a watch that asked for
/// it), read with the caller's `metadata`. A create (a put whose create revision is its
/// revision) has none; a revision etcd compacted (or a read etcd refuses the caller)
/// leaves it out, as etcd's send loop does when its own read fails.
///
/// # Errors
/// etcd could not be asked ([`FILL_ATTEMPTS`] times, each bounded by
/// [`FILL_TIMEOUT`]): the event is not sent without the prev_kv its watch asked for.
pub(crate) async fn fill(
    upstream: &Upstream,
    metadata: &MetadataMap,
    resp: &mut WatchResponse,
) -> Result<(), Status> {
    for e in &mut resp.events {
        let Some(kv) = e.kv.as_ref() else { continue };
        let created = e.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
        if e.prev_kv.is_some() || created {
            continue;
        }
        let req = RangeRequest {
            key: kv.key.clone(),
            revision: kv.mod_revision - 1,
            ..Default::default()
        };
        let revision = kv.mod_revision;
        match read(upstream, metadata, req).await {
            Ok(prev) => {
                tracing::debug!(
                    watch_id = resp.watch_id,
                    revision,
                    "filled in the prev_kv etcd left out"
                );
                e.prev_kv = prev;
            }
            Err(s) if s.code() == Code::OutOfRange || etcd_errors::is_auth_refusal(&s) => {
                tracing::debug!(error = %s, revision, "etcd refused the prev_kv it left out");
            }
            Err(s) => {
                tracing::warn!(
                    error = %s,
                    watch_id = resp.watch_id,
                    revision,
                    "could not read the prev_kv etcd left out; the client's stream ends so that it resumes"
                );
                return Err(Status::unavailable(format!(
                    "etcd-cache-proxy could not read from etcd the prev_kv of watch {}'s \
                     event at revision {revision} ({FILL_ATTEMPTS} attempts): {}",
                    resp.watch_id,
                    s.message()
                )));
            }
        }
    }
    Ok(())
}

/// The key of `req` at its revision, asked again (after 10, 50, 200 ms) while etcd
/// cannot be reached; etcd's refusals (compacted, permission) are answers.
async fn read(
    upstream: &Upstream,
    metadata: &MetadataMap,
    req: RangeRequest,
) -> Result<Option<KeyValue>, Status> {
    let mut last = Status::unavailable("not asked");
    for (attempt, pause) in FILL_PAUSES.iter().enumerate() {
        if attempt > 0 {
            tokio::time::sleep(*pause).await;
        }
        let call = call_upstream!(upstream, metadata, req.clone(), kv.range);
        match tokio::time::timeout(FILL_TIMEOUT, call).await {
            Ok(Ok(r)) => return Ok(r.into_inner().kvs.into_iter().next()),
            Ok(Err(s)) if s.code() == Code::OutOfRange || etcd_errors::is_auth_refusal(&s) => {
                return Err(s)
            }
            Ok(Err(s)) => last = s,
            Err(_) => {
                last = Status::deadline_exceeded(format!(
                    "no answer in {} ms",
                    FILL_TIMEOUT.as_millis()
                ))
            }
        }
    }
    Err(last)
}
