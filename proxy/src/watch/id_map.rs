//! Maps, sets and queues of a stream's watches, for every file of the watch path.

use std::collections::VecDeque;

/// A map keyed by watch id. These are looked up once or more per response sent, and
/// std's default SipHash was a visible share of the proxy's CPU under load; foldhash
/// (randomly seeded per map) is several times faster. A watch id is the client's own
/// choice, and a map holds one stream's watches only.
pub(crate) type IdMap<V> = std::collections::HashMap<i64, V, foldhash::quality::RandomState>;
/// A set of watch ids (see [`IdMap`]).
pub(crate) type IdSet = std::collections::HashSet<i64, foldhash::quality::RandomState>;

/// The room a drained queue keeps (see [`release_drained`]).
const KEPT_ROOM: usize = 8;

/// Gives back the room a queue grew to in a burst once it is empty: a client that
/// pipelines its creates grows a stream's queues to the number of its watches, and a
/// `VecDeque` never shrinks by itself, so an idle stream kept that high-water mark for
/// life (about 380 bytes per watch at 100 watches per stream; PERFORMANCE.md section 9).
pub(crate) fn release_drained<T>(queue: &mut VecDeque<T>) {
    if queue.is_empty() && queue.capacity() > KEPT_ROOM {
        queue.shrink_to(KEPT_ROOM);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_queue_gives_back_its_burst() {
        let mut q: VecDeque<u64> = (0..1_000).collect();
        release_drained(&mut q);
        assert!(q.capacity() >= 1_000, "not while it holds anything");
        q.clear();
        release_drained(&mut q);
        assert!(q.capacity() <= 2 * KEPT_ROOM, "{}", q.capacity());
        let mut small: VecDeque<u64> = VecDeque::with_capacity(4);
        release_drained(&mut small);
        assert_eq!(small.capacity(), 4, "a small queue keeps its room");
    }
}
