//! Put -> delivery latency histograms and delivery counters, one set per thread (no shared
//! cache line on the hot path), merged when a run ends (the fan-out bench).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

static BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the first call (the clock the writers stamp values with).
#[inline]
pub(crate) fn now_ns() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Log-linear buckets: 32 per power of two (about 3% resolution), up to ~2^40 ns.
const SUB_BITS: u32 = 5;
const BUCKETS: usize = (41 - SUB_BITS as usize) << SUB_BITS;

#[inline]
fn bucket(v: u64) -> usize {
    let v = v.max(1);
    let msb = 63 - v.leading_zeros();
    if msb < SUB_BITS {
        v as usize
    } else {
        let shift = msb - SUB_BITS;
        let idx =
            (((shift + 1) as usize) << SUB_BITS) + ((v >> shift) as usize & ((1 << SUB_BITS) - 1));
        idx.min(BUCKETS - 1)
    }
}

fn bucket_value(idx: usize) -> u64 {
    let sub = (idx & ((1 << SUB_BITS) - 1)) as u64;
    let group = idx >> SUB_BITS;
    if group == 0 {
        sub
    } else {
        let shift = group as u32 - 1;
        // Middle of the bucket.
        (((1u64 << SUB_BITS) | sub) << shift) + ((1u64 << shift) >> 1)
    }
}

struct Local {
    hist: Vec<AtomicU64>,
    deliveries: AtomicU64,
    /// Watch responses that carried events (their events are counted in `deliveries`).
    responses: AtomicU64,
}

static REGISTRY: Mutex<Vec<Arc<Local>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: Arc<Local> = {
        let l = Arc::new(Local {
            hist: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            deliveries: AtomicU64::new(0),
            responses: AtomicU64::new(0),
        });
        REGISTRY.lock().unwrap().push(l.clone());
        l
    };
}

/// Records `events` deliveries of a put sent at `sent_ns`, received now. Only the owning
/// thread writes its counters, so a relaxed load + store is enough.
#[inline]
pub(crate) fn record(sent_ns: u64, now: u64, events: u64) {
    LOCAL.with(|l| {
        let b = &l.hist[bucket(now.saturating_sub(sent_ns))];
        b.store(b.load(Ordering::Relaxed) + events, Ordering::Relaxed);
        l.deliveries.store(
            l.deliveries.load(Ordering::Relaxed) + events,
            Ordering::Relaxed,
        );
    });
}

/// Counts one watch response with events (same single-writer rule as [`record`]).
#[inline]
pub(crate) fn record_response() {
    LOCAL.with(|l| {
        l.responses
            .store(l.responses.load(Ordering::Relaxed) + 1, Ordering::Relaxed)
    });
}

/// Zeroes every thread's histogram and counters (before a run).
pub(crate) fn reset_stats() {
    for l in REGISTRY.lock().unwrap().iter() {
        l.hist.iter().for_each(|b| b.store(0, Ordering::Relaxed));
        l.deliveries.store(0, Ordering::Relaxed);
        l.responses.store(0, Ordering::Relaxed);
    }
}

/// Watch responses with events, over every thread.
pub(crate) fn total_responses() -> u64 {
    REGISTRY
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.responses.load(Ordering::Relaxed))
        .sum()
}

/// Deliveries (events received), over every thread.
pub(crate) fn total_deliveries() -> u64 {
    REGISTRY
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.deliveries.load(Ordering::Relaxed))
        .sum()
}

/// The latencies at the quantiles `ps` (0.5, 0.99) over every thread's deliveries, each
/// the middle of its bucket.
pub(crate) fn percentiles(ps: &[f64]) -> Vec<Duration> {
    let mut merged = vec![0u64; BUCKETS];
    for l in REGISTRY.lock().unwrap().iter() {
        for (m, b) in merged.iter_mut().zip(&l.hist) {
            *m += b.load(Ordering::Relaxed);
        }
    }
    let total: u64 = merged.iter().sum();
    ps.iter()
        .map(|&p| {
            if total == 0 {
                return Duration::ZERO;
            }
            let want = ((total as f64) * p).ceil().max(1.0) as u64;
            let mut acc = 0;
            for (i, c) in merged.iter().enumerate() {
                acc += c;
                if acc >= want {
                    return Duration::from_nanos(bucket_value(i));
                }
            }
            Duration::ZERO
        })
        .collect()
}
