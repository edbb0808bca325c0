//! Exponential reconnect backoff with equal jitter.

use std::time::Duration;

use rand::Rng;

/// Delays of `initial * 2^n`, capped at `max`, each drawn uniformly from
/// `[cap/2, cap]` so that many caches restarting together do not reconnect in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: initial,
        }
    }

    /// The next delay.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let cap = self.current;
        self.current = (self.current * 2).min(self.max);
        let lo = cap / 2;
        let jitter = rand::rng().random_range(0..=(cap - lo).as_micros() as u64);
        lo + Duration::from_micros(jitter)
    }

    /// Back to the first delay (after a healthy connection).
    pub(crate) fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let caps = [10, 20, 40, 80, 80, 80];
        for cap in caps {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(cap), "{d:?} > {cap}ms");
            assert!(d >= Duration::from_millis(cap) / 2, "{d:?} < {cap}/2 ms");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(10));
    }
}
